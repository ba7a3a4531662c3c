package ociimage

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestWriteTarballLoadsBack(t *testing.T) {
	img, err := App(AppOptions{Binaries: []string{staticBinary(t, "producer")}})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "producer.tar")
	if err := WriteTarball(p, "ms2m/producer:dev", img); err != nil {
		t.Fatalf("WriteTarball: %v", err)
	}
	tag, err := name.NewTag("ms2m/producer:dev")
	if err != nil {
		t.Fatal(err)
	}
	got, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		t.Fatalf("load tarball: %v", err)
	}
	sameImageContent(t, img, got)

	// The docker-archive names the image by the ref as written.
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(p) })
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ms2m/producer:dev"}, m[0].RepoTags); diff != "" {
		t.Errorf("RepoTags (-want +got):\n%s", diff)
	}
}

func TestWriteTarballRejectsBadRef(t *testing.T) {
	img, err := App(AppOptions{Binaries: []string{staticBinary(t, "x")}})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "x.tar")
	if err := WriteTarball(p, "Not A Ref", img); err == nil {
		t.Fatal("WriteTarball accepted a malformed ref")
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("a failed write left %s behind (stat: %v)", p, err)
	}
}

func TestWriteOCILayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "layout")
	a, err := App(AppOptions{Binaries: []string{staticBinary(t, "sidecar")}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := App(AppOptions{Binaries: []string{staticBinary(t, "webhook")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		ref string
		img v1.Image
	}{{"ms2m/sidecar:dev", a}, {"ms2m/webhook:dev", b}, {"ms2m/sidecar:dev", b}} {
		if err := WriteOCILayout(dir, step.ref, step.img); err != nil {
			t.Fatalf("WriteOCILayout %s: %v", step.ref, err)
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	bd, _ := b.Digest()
	got := map[string]v1.Hash{}
	for _, d := range im.Manifests {
		got[d.Annotations[AnnotationRefName]] = d.Digest
		if d.Annotations[AnnotationContainerdImageName] != d.Annotations[AnnotationRefName] {
			t.Errorf("descriptor %s: containerd name %q differs from ref name %q", d.Digest,
				d.Annotations[AnnotationContainerdImageName], d.Annotations[AnnotationRefName])
		}
		if d.Platform == nil || d.Platform.String() != "linux/amd64" {
			t.Errorf("descriptor %s: platform %v, want linux/amd64", d.Digest, d.Platform)
		}
	}
	want := map[string]v1.Hash{"ms2m/sidecar:dev": bd, "ms2m/webhook:dev": bd}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layout refs (-want +got):\n%s", diff)
	}
}

func TestWriteOCIArchiveKeepsCheckpointManifest(t *testing.T) {
	archive, _ := fakeCheckpointArchive(t)
	img, err := Checkpoint(archive, "counter")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	p := filepath.Join(tmp, "ckpt.tar")
	const ref = "localhost/counter-checkpoint:v1"
	if err := WriteOCIArchive(p, ref, img); err != nil {
		t.Fatalf("WriteOCIArchive: %v", err)
	}

	// Unpack it as `ctr images import` would see it, and read it as a layout.
	dir := filepath.Join(tmp, "unpacked")
	untar(t, p, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("read unpacked archive as an OCI layout: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if diff := cmp.Diff(refAnnotations(ref), desc.Annotations); diff != "" {
		t.Errorf("index descriptor annotations (-want +got):\n%s", diff)
	}
	got, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if desc.Digest != want {
		t.Errorf("archived manifest digest %s, want %s", desc.Digest, want)
	}
	m, err := got.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Annotations[AnnotationCheckpointContainerd] != "counter" || m.Annotations[AnnotationCheckpointCRIO] != "counter" {
		t.Errorf("archived manifest annotations = %v, want both checkpoint keys", m.Annotations)
	}
	sameImageContent(t, img, got)

	var layoutFile struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(mustRead(t, filepath.Join(dir, "oci-layout")), &layoutFile); err != nil || layoutFile.Version != "1.0.0" {
		t.Errorf("oci-layout = %+v, %v", layoutFile, err)
	}
}

// sameImageContent compares config and layer blobs of two images.
func sameImageContent(t *testing.T, want, got v1.Image) {
	t.Helper()
	wc, _ := want.ConfigName()
	gc, err := got.ConfigName()
	if err != nil || gc != wc {
		t.Errorf("config digest = %s, %v; want %s", gc, err, wc)
	}
	wl, _ := want.Layers()
	gl, err := got.Layers()
	if err != nil || len(gl) != len(wl) {
		t.Fatalf("layers = %d, %v; want %d", len(gl), err, len(wl))
	}
	for i := range wl {
		wd, _ := wl[i].Digest()
		gd, err := gl[i].Digest()
		if err != nil || gd != wd {
			t.Errorf("layer %d digest = %s, %v; want %s", i, gd, err, wd)
		}
	}
}

func untar(t *testing.T, src, dst string) {
	t.Helper()
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dst, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, tr); err != nil {
			t.Fatal(err)
		}
		out.Close()
	}
}
