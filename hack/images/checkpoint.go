package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/ms2m/ms2m/internal/ociimage"
)

func cmdCheckpoint(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("checkpoint", flag.ContinueOnError)
	archive := fs.String("archive", "", "kubelet checkpoint archive, checkpoint-<pod>_<ns>-<container>-<time>.tar (required)")
	container := fs.String("container", "", "name of the checkpointed container (required)")
	ref := fs.String("ref", "", "image ref to push to, HOST:PORT/REPO:TAG (required)")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the registry (loopback and private addresses use it anyway)")
	auth := fs.String("auth", "", "docker config.json with credentials for the registry (default anonymous)")
	out := fs.String("o", "", "also write the image to this file as an OCI archive, for `ctr images import`")
	noPush := fs.Bool("no-push", false, "do not push; only write -o")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	switch {
	case *archive == "":
		return usagef("-archive is required: the checkpoint archive the kubelet wrote")
	case *container == "":
		return usagef("-container is required: the name of the checkpointed container")
	case *ref == "":
		return usagef("-ref is required: the image name to give the checkpoint")
	case *noPush && *out == "":
		return usagef("-no-push needs -o, or nothing would be written")
	}

	start := time.Now()
	img, err := ociimage.Checkpoint(*archive, *container)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	size, err := imageSize(img)
	if err != nil {
		return err
	}
	built := time.Since(start)
	fmt.Fprintf(stdout, "built %s %s (%s) in %v\n", *ref, digest, humanSize(size), built.Round(time.Millisecond))
	if *out != "" {
		t := time.Now()
		if err := ociimage.WriteOCIArchive(*out, *ref, img); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s in %v\n", *out, time.Since(t).Round(time.Millisecond))
	}
	if !*noPush {
		t := time.Now()
		if err := ociimage.Push(ctx, img, *ref, ociimage.PushOptions{Insecure: *insecure, AuthFile: *auth}); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "pushed %s@%s in %v\n", *ref, digest, time.Since(t).Round(time.Millisecond))
	}
	fmt.Fprintf(stdout, "total %v\n", time.Since(start).Round(time.Millisecond))
	return nil
}

func cmdRegistry(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("registry", flag.ContinueOnError)
	addr := fs.String("addr", "", "address to listen on, HOST:PORT (required; port 0 picks one)")
	dir := fs.String("dir", "", "directory for blobs and manifests (required; kept across restarts)")
	quiet := fs.Bool("quiet", false, "do not log each request")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *addr == "" {
		return usagef("-addr is required: the HOST:PORT that nodes pull from")
	}
	if *dir == "" {
		return usagef("-dir is required: where blobs and manifests are kept")
	}
	var opts []ociimage.RegistryOption
	if !*quiet {
		opts = append(opts, ociimage.WithRequestLog(slog.New(slog.NewTextHandler(stderr, nil))))
	}
	reg, err := ociimage.ServeRegistry(*addr, *dir, opts...)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "registry listening on %s (plain HTTP), data in %s\n", reg.Addr(), *dir)
	if f, ok := stdout.(*os.File); ok {
		_ = f.Sync() // a terminal or pipe cannot sync, and needs not
	}
	<-ctx.Done()
	return reg.Close()
}
