package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// AnnotationRefName is the OCI layout's name for an image.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// AnnotationContainerdImageName is the full image name that
	// `ctr images import` gives an image of an OCI layout.
	AnnotationContainerdImageName = "io.containerd.image.name"
)

// WriteTarball writes img to path as a docker-archive tarball tagged ref,
// which `ctr images import` and `docker load` read. The format keeps no
// manifest: an importer writes a manifest of its own, so the imported
// digest differs from img's and manifest annotations are lost. Use
// WriteOCIArchive for checkpoint images.
func WriteTarball(path, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("write tarball %s: ref %q is not a tagged image name: %w", path, ref, err)
	}
	return writeFileAtomic(path, func(w io.Writer) error {
		return tarball.Write(tag, img, w)
	})
}

// WriteOCILayout adds img to the OCI image layout in dir, named ref, and
// creates the layout if dir holds none. An image already named ref is
// replaced; its blobs stay until the layout is garbage collected.
func WriteOCILayout(dir, ref string, img v1.Image) error {
	if ref == "" {
		return fmt.Errorf("write OCI layout %s: empty ref", dir)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		if p, err = layout.Write(dir, empty.Index); err != nil {
			return fmt.Errorf("create OCI layout %s: %w", dir, err)
		}
	}
	opts := []layout.Option{layout.WithAnnotations(refAnnotations(ref))}
	if cf, err := img.ConfigFile(); err == nil && cf.Platform() != nil {
		opts = append(opts, layout.WithPlatform(*cf.Platform()))
	}
	if err := p.ReplaceImage(img, match.Annotation(AnnotationRefName, ref), opts...); err != nil {
		return fmt.Errorf("write %s to OCI layout %s: %w", ref, dir, err)
	}
	return nil
}

// WriteOCIArchive writes img to path as an OCI image layout in one tar,
// named ref. `ctr images import` keeps its manifest as it is, digest and
// annotations included, which a checkpoint image needs. Layers are
// streamed, so a large checkpoint is never held in memory.
func WriteOCIArchive(path, ref string, img v1.Image) error {
	if ref == "" {
		return fmt.Errorf("write OCI archive %s: empty ref", path)
	}
	return writeFileAtomic(path, func(w io.Writer) error {
		return writeOCIArchive(w, ref, img)
	})
}

func writeOCIArchive(w io.Writer, ref string, img v1.Image) error {
	rawManifest, err := img.RawManifest()
	if err != nil {
		return fmt.Errorf("read manifest: %w", err)
	}
	mt, err := img.MediaType()
	if err != nil {
		return fmt.Errorf("read media type: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("read digest: %w", err)
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	configName, err := img.ConfigName()
	if err != nil {
		return fmt.Errorf("read config digest: %w", err)
	}
	desc := v1.Descriptor{
		MediaType:   mt,
		Size:        int64(len(rawManifest)),
		Digest:      digest,
		Annotations: refAnnotations(ref),
	}
	if cf, err := img.ConfigFile(); err == nil {
		desc.Platform = cf.Platform()
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests:     []v1.Descriptor{desc},
	})
	if err != nil {
		return fmt.Errorf("encode index: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("read layers: %w", err)
	}

	tw := tar.NewWriter(w)
	epoch := time.Unix(0, 0)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch})
	}
	file := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: epoch}); err != nil {
			return err
		}
		n, err := io.Copy(tw, r)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if n != size {
			return fmt.Errorf("%s: wrote %d bytes, want %d; did the file change?", name, n, size)
		}
		return nil
	}
	bytesFile := func(name string, b []byte) error {
		return file(name, int64(len(b)), bytes.NewReader(b))
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

	if err := bytesFile("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := bytesFile("index.json", index); err != nil {
		return err
	}
	if err := dir("blobs/"); err != nil {
		return err
	}
	if err := dir("blobs/sha256/"); err != nil {
		return err
	}
	if err := bytesFile(blob(digest), rawManifest); err != nil {
		return err
	}
	if err := bytesFile(blob(configName), rawConfig); err != nil {
		return err
	}
	written := map[v1.Hash]bool{}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return fmt.Errorf("read layer digest: %w", err)
		}
		if written[d] {
			continue
		}
		written[d] = true
		size, err := l.Size()
		if err != nil {
			return fmt.Errorf("read layer %s size: %w", d, err)
		}
		rc, err := l.Compressed()
		if err != nil {
			return fmt.Errorf("open layer %s: %w", d, err)
		}
		err = file(blob(d), size, rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return tw.Close()
}

func refAnnotations(ref string) map[string]string {
	return map[string]string{AnnotationRefName: ref, AnnotationContainerdImageName: ref}
}

// writeFileAtomic writes path through a temporary file in the same
// directory, so a reader never sees half a file.
func writeFileAtomic(path string, write func(io.Writer) error) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
