package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/ociimage/debianpy"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(t.Context(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsageErrors(t *testing.T) {
	tests := map[string]struct {
		args     []string
		wantCode int
		wantErr  string
	}{
		"no command":          {args: nil, wantCode: 2, wantErr: "usage:"},
		"unknown command":     {args: []string{"pull"}, wantCode: 2, wantErr: `unknown command "pull"`},
		"build without -o":    {args: []string{"build"}, wantCode: 2, wantErr: "-o is required"},
		"build bad -only":     {args: []string{"build", "-o", "x", "-only", "nginx"}, wantCode: 2, wantErr: `-only: unknown image "nginx"`},
		"build bad -tag":      {args: []string{"build", "-o", "x", "-tag", "a b"}, wantCode: 2, wantErr: "-tag"},
		"build bad platform":  {args: []string{"build", "-o", "x", "-platforms", "linux/s390x"}, wantCode: 2, wantErr: `-platforms: platform linux/s390x: architecture "s390x"`},
		"build no platform":   {args: []string{"build", "-o", "x", "-platforms", ""}, wantCode: 2, wantErr: "-platforms: no platform given"},
		"inspect no -ref":     {args: []string{"inspect"}, wantCode: 2, wantErr: "-ref is required"},
		"unknown flag":        {args: []string{"build", "-output", "x"}, wantCode: 2, wantErr: "-output"},
		"stray argument":      {args: []string{"build", "-o", "x", "extra"}, wantCode: 2, wantErr: `unexpected argument "extra"`},
		"push no -registry":   {args: []string{"push", "-from", "x"}, wantCode: 2, wantErr: "-registry is required"},
		"push scheme":         {args: []string{"push", "-registry", "http://h:5000", "-from", "x"}, wantCode: 2, wantErr: "HOST:PORT only"},
		"push no -from":       {args: []string{"push", "-registry", "h:5000"}, wantCode: 2, wantErr: "-from is required"},
		"push empty dir":      {args: []string{"push", "-registry", "h:5000", "-from", t.TempDir()}, wantCode: 1, wantErr: "run `images build"},
		"checkpoint no args":  {args: []string{"checkpoint"}, wantCode: 2, wantErr: "-archive is required"},
		"checkpoint no name":  {args: []string{"checkpoint", "-archive", "a.tar"}, wantCode: 2, wantErr: "-container is required"},
		"checkpoint no ref":   {args: []string{"checkpoint", "-archive", "a.tar", "-container", "c"}, wantCode: 2, wantErr: "-ref is required"},
		"no-push without -o":  {args: []string{"checkpoint", "-archive", "a.tar", "-container", "c", "-ref", "h/r:1", "-no-push"}, wantCode: 2, wantErr: "-no-push needs -o"},
		"missing archive":     {args: []string{"checkpoint", "-archive", "/nonexistent.tar", "-container", "c", "-ref", "h/r:1"}, wantCode: 1, wantErr: "/nonexistent.tar"},
		"registry no -addr":   {args: []string{"registry", "-dir", "d"}, wantCode: 2, wantErr: "-addr is required"},
		"registry no -dir":    {args: []string{"registry", "-addr", "127.0.0.1:0"}, wantCode: 2, wantErr: "-dir is required"},
		"help is not failure": {args: []string{"build", "-h"}, wantCode: 0, wantErr: "-tag"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tc.args...)
			if code != tc.wantCode || !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr, tc.wantCode, tc.wantErr)
			}
		})
	}
}

func TestDestRef(t *testing.T) {
	tests := map[string]struct{ ref, want string }{
		"ms2m image":     {ref: "ms2m/sidecar:dev", want: "10.0.0.1:5000/ms2m/sidecar:dev"},
		"pause":          {ref: "registry.k8s.io/pause:3.10", want: "10.0.0.1:5000/pause:3.10"},
		"already local":  {ref: "127.0.0.1:5001/a/b:1", want: "10.0.0.1:5000/a/b:1"},
		"deep repo path": {ref: "host.local/x/y/z:t", want: "10.0.0.1:5000/x/y/z:t"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := destRef("10.0.0.1:5000", tc.ref)
			if err != nil || got != tc.want {
				t.Errorf("destRef(%q) = %q, %v; want %q", tc.ref, got, err, tc.want)
			}
		})
	}
}

// TestBuildPushCheckpoint builds two real images with the Go toolchain,
// pushes them to an in-process registry, pulls them back, and turns a
// checkpoint archive into a pushed image and an OCI archive.
func TestBuildPushCheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	out := t.TempDir()
	code, stdout, stderr := runCLI(t, "build", "-o", out, "-tag", "test", "-only", "pause,producer")
	if code != 0 {
		t.Fatalf("build: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"registry.k8s.io/pause:3.10", "ms2m/producer:test", "NAME"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("build table lacks %q:\n%s", want, stdout)
		}
	}
	idx, err := readIndex(out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, bi := range idx.Images {
		names = append(names, bi.Name)
		tag, err := name.NewTag(bi.Ref)
		if err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(filepath.Join(out, bi.Tarball), &tag)
		if err != nil {
			t.Fatalf("load %s: %v", bi.Tarball, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Config.User != ociimage.NonRootUser || cf.Config.Entrypoint[0] != "/"+bi.Name {
			t.Errorf("%s: user %q entrypoint %q", bi.Name, cf.Config.User, cf.Config.Entrypoint)
		}
	}
	if diff := cmp.Diff([]string{"pause", "producer"}, names); diff != "" {
		t.Errorf("built images (-want +got):\n%s", diff)
	}

	reg, err := ociimage.ServeRegistry("127.0.0.1:0", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	if code, _, stderr := runCLI(t, "push", "-registry", reg.Addr(), "-from", out); code != 0 {
		t.Fatalf("push: exit %d\n%s", code, stderr)
	}
	for _, bi := range idx.Images {
		dest, _ := destRef(reg.Addr(), bi.Ref)
		r, _ := name.ParseReference(dest)
		img, err := remote.Image(r)
		if err != nil {
			t.Fatalf("pull %s: %v", dest, err)
		}
		if d, _ := img.Digest(); d.String() != bi.Digest {
			t.Errorf("%s: pulled digest %s, built %s", dest, d, bi.Digest)
		}
	}
	pauseRef, _ := destRef(reg.Addr(), "registry.k8s.io/pause:3.10")
	if code, stdout, stderr := runCLI(t, "inspect", "-ref", pauseRef); code != 0 || !strings.Contains(stdout, "one image sha256:") || !strings.Contains(stdout, "EM_X86_64") {
		t.Errorf("inspect of a single-platform image: exit %d\n%s%s", code, stdout, stderr)
	}
	if code, _, stderr := runCLI(t, "push", "-registry", reg.Addr(), "-from", out, "-only", "webhook"); code != 2 || !strings.Contains(stderr, "-only: webhook not in") {
		t.Errorf("push -only of an unbuilt image: exit %d, %q", code, stderr)
	}

	archive := filepath.Join(t.TempDir(), "checkpoint-counter_default-counter-2026.tar")
	writeTar(t, archive, map[string]string{"config.dump": "{}", "spec.dump": "{}"})
	ociArchive := filepath.Join(t.TempDir(), "ckpt.tar")
	ref := reg.Addr() + "/ms2m/counter-checkpoint:v1"
	code, stdout, stderr = runCLI(t, "checkpoint", "-archive", archive, "-container", "counter", "-ref", ref, "-o", ociArchive)
	if code != 0 {
		t.Fatalf("checkpoint: exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "pushed "+ref+"@sha256:") || !strings.Contains(stdout, "total ") {
		t.Errorf("checkpoint output:\n%s", stdout)
	}
	r, _ := name.ParseReference(ref)
	img, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Annotations[ociimage.AnnotationCheckpointContainerd] != "counter" {
		t.Errorf("pushed checkpoint annotations = %v", m.Annotations)
	}
	if st, err := os.Stat(ociArchive); err != nil || st.Size() == 0 {
		t.Errorf("OCI archive: %v", err)
	}
}

// TestBuildConsumerPython builds the image of the Python consumer from the
// host's Debian python3 and checks its config and its script.
// internal/ociimage/debianpy runs the same image's python with chroot.
func TestBuildConsumerPython(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 15 MB image")
	}
	if _, err := debianpy.Paths("pika"); err != nil {
		t.Skipf("SKIPPING: %v", err)
	}
	out := t.TempDir()
	code, stdout, stderr := runCLI(t, "build", "-o", out, "-tag", "test", "-only", "consumer-python")
	if code != 0 || !strings.Contains(stdout, "ms2m/consumer-python:test") {
		t.Fatalf("build: exit %d\n%s%s", code, stdout, stderr)
	}
	idx, err := readIndex(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(idx.Images) != 1 {
		t.Fatalf("built %d images, want 1", len(idx.Images))
	}
	tag, _ := name.NewTag("ms2m/consumer-python:test")
	img, err := tarball.ImageFromPath(filepath.Join(out, idx.Images[0].Tarball), &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"/usr/bin/python3", "/app/consumer.py"}, cf.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user = %q, want 65532:65532", cf.Config.User)
	}
	script, err := os.ReadFile("../../examples/consumer-python/consumer.py")
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers = %d, %v; want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	found := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		found[h.Name] = true
		if h.Name == "app/consumer.py" {
			got, _ := io.ReadAll(tr)
			if !bytes.Equal(got, script) {
				t.Errorf("app/consumer.py differs from examples/consumer-python/consumer.py")
			}
		}
	}
	for _, want := range []string{"app/consumer.py", "usr/bin/python3", "usr/lib/python3/dist-packages/pika/__init__.py", "etc/passwd"} {
		if !found[want] {
			t.Errorf("layer lacks %s", want)
		}
	}
	t.Logf("consumer-python: %s", humanSize(idx.Images[0].Size))
}

func TestRegistryCommandStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"registry", "-addr", "127.0.0.1:0", "-dir", t.TempDir(), "-quiet"}, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || !strings.Contains(line, "registry listening on 127.0.0.1:") {
		t.Fatalf("first line %q, %v", line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }() // the rest of the log, unread
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("registry exited %d, want 0", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("registry did not stop after its context ended")
	}
}

func writeTar(t *testing.T, path string, files map[string]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for n, c := range files {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o600, Size: int64(len(c)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
