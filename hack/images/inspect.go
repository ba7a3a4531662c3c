package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/ms2m/ms2m/internal/ociimage"
)

// cmdInspect prints what a reference holds in its registry: each platform
// of an image index (or the one of an image), its manifest's digest, the
// config's os/arch and the machine of the entrypoint binary. It fails when
// one of them does not fit its platform.
func cmdInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	ref := fs.String("ref", "", "image reference with its registry, e.g. HOST:PORT/ms2m/sidecar:dev (required)")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the registry (loopback and private addresses use it anyway)")
	auth := fs.String("auth", "", "docker config.json with credentials for the registry (default anonymous)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *ref == "" {
		return usagef("-ref is required: the image to inspect")
	}
	in, err := ociimage.Inspect(ctx, *ref, ociimage.PushOptions{Insecure: *insecure, AuthFile: *auth})
	if err != nil {
		return err
	}
	entries := in.Entries
	if in.Index {
		fmt.Fprintf(stdout, "%s: image index %s, %d images\n", *ref, in.Digest, len(entries))
	} else {
		fmt.Fprintf(stdout, "%s: one image %s, no index\n", *ref, in.Digest)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PLATFORM\tDIGEST\tCONFIG\tENTRYPOINT\tMACHINE")
	var bad []error
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\n", e.Platform, e.Digest, e.Config, e.Entrypoint, e.Machine)
		if err := e.Check(); err != nil {
			bad = append(bad, err)
		}
	}
	tw.Flush()
	if len(bad) > 0 {
		return fmt.Errorf("%s: %d of %d images do not fit their platform; first: %w", *ref, len(bad), len(entries), bad[0])
	}
	return nil
}
