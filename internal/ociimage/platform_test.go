package ociimage

import (
	"bytes"
	"debug/elf"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func TestParsePlatforms(t *testing.T) {
	amd64 := v1.Platform{OS: "linux", Architecture: "amd64"}
	arm64 := v1.Platform{OS: "linux", Architecture: "arm64"}
	tests := map[string]struct {
		in      string
		want    []v1.Platform
		wantErr string
	}{
		"both":           {in: "linux/amd64,linux/arm64", want: []v1.Platform{amd64, arm64}},
		"order kept":     {in: "linux/arm64, linux/amd64", want: []v1.Platform{arm64, amd64}},
		"host":           {in: "host", want: []v1.Platform{HostPlatform()}},
		"trailing comma": {in: "linux/arm64,", want: []v1.Platform{arm64}},
		"empty":          {in: "", wantErr: "no platform given"},
		"twice":          {in: "linux/amd64,linux/amd64", wantErr: "given twice"},
		"host and same":  {in: "host," + HostPlatform().String(), wantErr: "given twice"},
		"no arch":        {in: "linux", wantErr: "want os/arch"},
		"variant":        {in: "linux/arm/v7", wantErr: "want os/arch"},
		"other os":       {in: "windows/amd64", wantErr: "only linux"},
		"other arch":     {in: "linux/s390x", wantErr: `"s390x" is not one of amd64, arm64`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParsePlatforms(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParsePlatforms(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParsePlatforms(%q) (-want +got):\n%s", tc.in, diff)
			}
			if back, err := ParsePlatforms(FormatPlatforms(got)); err != nil || !cmp.Equal(back, got) {
				t.Errorf("FormatPlatforms(%v) = %q reads back as %v, %v", got, FormatPlatforms(got), back, err)
			}
		})
	}
}

// TestIndexPushedAndReadBack makes an image of the same program for each
// default platform, pushes their index to go-containerregistry's registry
// on loopback, and reads it back as a node would: the index names both
// platforms, each manifest's config says its platform, the entrypoint in
// each is an ELF executable for that platform's machine, and a pull for a
// platform gets that platform's image.
func TestIndexPushedAndReadBack(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/ms2m/sidecar:multi"

	var imgs []v1.Image
	for _, p := range DefaultPlatforms {
		img, err := App(AppOptions{Binaries: []string{staticBinaryFor(t, "sidecar", p.Architecture)}, Arch: p.Architecture})
		if err != nil {
			t.Fatalf("App for %s: %v", p, err)
		}
		imgs = append(imgs, img)
	}
	idx, err := Index(imgs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := PushIndex(t.Context(), idx, ref, PushOptions{}); err != nil {
		t.Fatal(err)
	}

	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(r)
	if err != nil {
		t.Fatal(err)
	}
	if desc.MediaType != types.OCIImageIndex {
		t.Fatalf("%s is a %s, want an OCI image index", ref, desc.MediaType)
	}
	pulled, err := desc.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := pulled.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []v1.Platform
	for _, d := range im.Manifests {
		if d.Platform == nil {
			t.Fatalf("manifest %s has no platform in the index", d.Digest)
		}
		if d.MediaType != types.OCIManifestSchema1 {
			t.Errorf("manifest %s: media type %s, want %s", d.Digest, d.MediaType, types.OCIManifestSchema1)
		}
		got = append(got, *d.Platform)
		img, err := pulled.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkImagePlatform(t, img, *d.Platform)
	}
	if diff := cmp.Diff(DefaultPlatforms, got); diff != "" {
		t.Errorf("index platforms (-want +got):\n%s", diff)
	}

	entries, err := InspectIndex(pulled)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := e.Check(); err != nil {
			t.Errorf("InspectIndex: %v", err)
		}
	}
	if len(entries) != len(DefaultPlatforms) {
		t.Errorf("InspectIndex found %d images, want %d", len(entries), len(DefaultPlatforms))
	}

	for _, p := range DefaultPlatforms {
		img, err := remote.Image(r, remote.WithPlatform(p))
		if err != nil {
			t.Fatalf("pull %s for %s: %v", ref, p, err)
		}
		checkImagePlatform(t, img, p)
	}
}

// checkImagePlatform fails t unless img's config names p and its
// entrypoint is an ELF executable for p's machine.
func checkImagePlatform(t *testing.T, img v1.Image, p v1.Platform) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != p.OS || cf.Architecture != p.Architecture {
		t.Errorf("%s: config says %s/%s", p, cf.OS, cf.Architecture)
	}
	if len(cf.Config.Entrypoint) != 1 {
		t.Fatalf("%s: entrypoint %q, want one binary", p, cf.Config.Entrypoint)
	}
	bin, err := ReadImageFile(img, cf.Config.Entrypoint[0])
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("%s: entrypoint %s: %v", p, cf.Config.Entrypoint[0], err)
	}
	if want := archMachine[p.Architecture]; f.Machine != want {
		t.Errorf("%s: entrypoint %s is for %v, want %v", p, cf.Config.Entrypoint[0], f.Machine, want)
	}
}

func TestIndexErrors(t *testing.T) {
	amd := must(App(AppOptions{Binaries: []string{staticBinary(t, "app")}}))
	tests := map[string]struct {
		imgs    []v1.Image
		wantErr string
	}{
		"none":           {imgs: nil, wantErr: "no images"},
		"platform twice": {imgs: []v1.Image{amd, amd}, wantErr: "two images for linux/amd64"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := Index(tc.imgs...); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Index error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestAppRefusesAnotherArchitecturesBinary(t *testing.T) {
	amd := staticBinaryFor(t, "app", "amd64")
	if _, err := App(AppOptions{Binaries: []string{amd}, Arch: "arm64"}); err == nil || !strings.Contains(err.Error(), "want EM_AARCH64") {
		t.Errorf("App of an amd64 binary as arm64: %v, want a machine mismatch", err)
	}
	if _, err := App(AppOptions{Binaries: []string{amd}, Arch: "riscv64"}); err == nil || !strings.Contains(err.Error(), "riscv64") {
		t.Errorf("App for riscv64: %v, want a refusal", err)
	}
	arm := staticBinaryFor(t, "app", "arm64")
	img, err := App(AppOptions{Binaries: []string{arm}, Arch: "arm64"})
	if err != nil {
		t.Fatal(err)
	}
	checkImagePlatform(t, img, v1.Platform{OS: "linux", Architecture: "arm64"})
}

// TestInspectIndexFindsAWrongBinary: an index whose arm64 descriptor names
// an amd64 image, and an arm64 image whose binary is an amd64 one, are
// each caught by Check.
func TestInspectIndexFindsAWrongBinary(t *testing.T) {
	amd := must(App(AppOptions{Binaries: []string{staticBinaryFor(t, "app", "amd64")}}))
	arm64 := v1.Platform{OS: "linux", Architecture: "arm64"}
	mislabelled := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{MediaType: types.OCIManifestSchema1, Platform: &arm64}})
	armCfg, err := amd.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	armCfg = armCfg.DeepCopy()
	armCfg.Architecture = "arm64"
	wrongBinary, err := Index(must(mutate.ConfigFile(amd, armCfg)))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		idx     v1.ImageIndex
		wantErr string
	}{
		"descriptor and config differ": {idx: mislabelled, wantErr: "the index says linux/arm64, the config linux/amd64"},
		"binary of another machine":    {idx: wrongBinary, wantErr: "entrypoint /app is for EM_X86_64, want EM_AARCH64"},
	} {
		t.Run(name, func(t *testing.T) {
			entries, err := InspectIndex(tc.idx)
			if err != nil || len(entries) != 1 {
				t.Fatalf("InspectIndex = %v, %v; want one entry", entries, err)
			}
			if err := entries[0].Check(); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Check = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
