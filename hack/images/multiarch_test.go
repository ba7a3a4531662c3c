package main

import (
	"debug/elf"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/ms2m/ms2m/internal/ociimage"
)

var (
	amd64 = v1.Platform{OS: "linux", Architecture: "amd64"}
	arm64 = v1.Platform{OS: "linux", Architecture: "arm64"}
)

func TestGoBuildPlan(t *testing.T) {
	own := target{name: "sidecar", pkg: "./cmd/sidecar", ownMultiArch: true}
	example := target{name: "consumer", pkg: "./examples/consumer"}
	python := target{name: "consumer-python", script: "consumer.py"}
	type step struct {
		Platform string
		Targets  []string
	}
	tests := map[string]struct {
		targets   []target
		platforms []v1.Platform
		want      []step
	}{
		"both platforms": {
			targets: []target{own, example, python}, platforms: []v1.Platform{amd64, arm64},
			want: []step{{"linux/amd64", []string{"sidecar", "consumer"}}, {"linux/arm64", []string{"sidecar"}}},
		},
		"arm64 only": {
			targets: []target{own, example}, platforms: []v1.Platform{arm64},
			want: []step{{"linux/arm64", []string{"sidecar"}}, {"linux/amd64", []string{"consumer"}}},
		},
		"no Go target": {targets: []target{python}, platforms: []v1.Platform{amd64, arm64}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got []step
			for _, s := range goBuildPlan(tc.targets, tc.platforms) {
				st := step{Platform: s.platform.String()}
				for _, t := range s.targets {
					st.Targets = append(st.Targets, t.name)
				}
				got = append(got, st)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("goBuildPlan (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTarballPlatform(t *testing.T) {
	if got := tarballPlatform([]v1.Platform{arm64, amd64}, amd64); !got.Equals(amd64) {
		t.Errorf("host among the built: %s, want linux/amd64", got)
	}
	if got := tarballPlatform([]v1.Platform{arm64}, amd64); !got.Equals(arm64) {
		t.Errorf("host not built: %s, want the first, linux/arm64", got)
	}
}

// TestBuildPushMultiArch builds hack/pause as one of ms2m's own images for
// amd64 and arm64 with the real Go toolchain, pushes it to
// go-containerregistry's registry on loopback, and reads the index back:
// both platforms, each manifest's config, and each entrypoint an ELF
// executable for its platform's machine; inspect says the same.
func TestBuildPushMultiArch(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles a binary")
	}
	saved := targets
	targets = []target{{name: "pause", pkg: "./hack/pause", ref: ms2mRef("pause"), ownMultiArch: true}}
	t.Cleanup(func() { targets = saved })

	out := t.TempDir()
	code, stdout, stderr := runCLI(t, "build", "-o", out, "-tag", "multi", "-platforms", "linux/amd64,linux/arm64")
	if code != 0 {
		t.Fatalf("build: exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "linux/amd64,linux/arm64") {
		t.Errorf("build table lacks the platforms:\n%s", stdout)
	}
	idx, err := readIndex(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(idx.Images) != 1 {
		t.Fatalf("built %d images, want 1", len(idx.Images))
	}
	bi := idx.Images[0]
	if bi.Platforms != "linux/amd64,linux/arm64" || bi.TarballPlatform != ociimage.HostPlatform().String() {
		t.Errorf("images.json: platforms %q, tarball's %q; want both, and the host's", bi.Platforms, bi.TarballPlatform)
	}
	tag, _ := name.NewTag(bi.Ref)
	tarImg, err := tarball.ImageFromPath(filepath.Join(out, bi.Tarball), &tag)
	if err != nil {
		t.Fatal(err)
	}
	if cf, err := tarImg.ConfigFile(); err != nil || cf.Architecture != ociimage.HostPlatform().Architecture {
		t.Errorf("tarball's image: %v; want the host's architecture", err)
	}

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	reg := strings.TrimPrefix(srv.URL, "http://")
	if code, _, stderr := runCLI(t, "push", "-registry", reg, "-from", out); code != 0 {
		t.Fatalf("push: exit %d\n%s", code, stderr)
	}
	dest, _ := destRef(reg, bi.Ref)
	r, err := name.ParseReference(dest)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(r)
	if err != nil {
		t.Fatal(err)
	}
	if !desc.MediaType.IsIndex() || desc.Digest.String() != bi.Digest {
		t.Fatalf("%s: %s %s; want the built index %s", dest, desc.MediaType, desc.Digest, bi.Digest)
	}
	pulled, err := desc.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	entries, err := ociimage.InspectIndex(pulled)
	if err != nil {
		t.Fatal(err)
	}
	type platformImage struct{ Platform, Config, Entrypoint, Machine string }
	var got []platformImage
	for _, e := range entries {
		got = append(got, platformImage{e.Platform.String(), e.Config.String(), e.Entrypoint, e.Machine.String()})
	}
	want := []platformImage{
		{"linux/amd64", "linux/amd64", "/pause", elf.EM_X86_64.String()},
		{"linux/arm64", "linux/arm64", "/pause", elf.EM_AARCH64.String()},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the pushed index's images (-want +got):\n%s", diff)
	}

	code, stdout, stderr = runCLI(t, "inspect", "-ref", dest)
	if code != 0 {
		t.Fatalf("inspect: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{"image index " + bi.Digest + ", 2 images", "linux/amd64  ", "EM_X86_64", "linux/arm64  ", "EM_AARCH64"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("inspect lacks %q:\n%s", want, stdout)
		}
	}
}
