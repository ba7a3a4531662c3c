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
	p, err := openLayout(dir)
	if err != nil {
		return err
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

// WriteOCILayoutIndex adds idx, with every image it names, to the OCI
// image layout in dir, named ref, as WriteOCILayout adds one image. An
// image or index already named ref is replaced.
func WriteOCILayoutIndex(dir, ref string, idx v1.ImageIndex) error {
	if ref == "" {
		return fmt.Errorf("write OCI layout %s: empty ref", dir)
	}
	p, err := openLayout(dir)
	if err != nil {
		return err
	}
	if err := p.ReplaceIndex(idx, match.Annotation(AnnotationRefName, ref), layout.WithAnnotations(refAnnotations(ref))); err != nil {
		return fmt.Errorf("write %s to OCI layout %s: %w", ref, dir, err)
	}
	return nil
}

// openLayout opens the OCI image layout in dir, creating an empty one if
// dir holds none.
func openLayout(dir string) (layout.Path, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		if p, err = layout.Write(dir, empty.Index); err != nil {
			return "", fmt.Errorf("create OCI layout %s: %w", dir, err)
		}
	}
	return p, nil
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

// writeOCIArchive writes img to w as the tar of an OCI image layout whose
// index names it ref, in this order:
//
//	oci-layout
//	index.json
//	blobs/
//	blobs/sha256/
//	blobs/sha256/<manifest digest>
//	blobs/sha256/<config digest>
//	blobs/sha256/<layer digest>   once per distinct layer, streamed
func writeOCIArchive(w io.Writer, ref string, img v1.Image) error {
	parts, err := readImage(ref, img)
	if err != nil {
		return err
	}
	aw := archiveWriter{tw: tar.NewWriter(w)}
	if err := aw.bytesFile("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := aw.bytesFile("index.json", parts.index); err != nil {
		return err
	}
	if err := aw.dir("blobs/"); err != nil {
		return err
	}
	if err := aw.dir("blobs/sha256/"); err != nil {
		return err
	}
	if err := aw.bytesFile(archiveBlob(parts.digest), parts.rawManifest); err != nil {
		return err
	}
	if err := aw.bytesFile(archiveBlob(parts.configName), parts.rawConfig); err != nil {
		return err
	}
	if err := aw.layers(parts.layers); err != nil {
		return err
	}
	return aw.tw.Close()
}

// imageParts is what an OCI archive holds of an image, read before the
// first byte is written: its manifest and config as they are, the index
// that names it, and its layers, which are read as they are written.
type imageParts struct {
	rawManifest []byte
	digest      v1.Hash // the manifest's
	rawConfig   []byte
	configName  v1.Hash // the config's digest
	index       []byte  // index.json
	layers      []v1.Layer
}

// readImage reads the parts of img for an archive whose index names it
// ref, with its platform when its config has one.
func readImage(ref string, img v1.Image) (imageParts, error) {
	var p imageParts
	var err error
	if p.rawManifest, err = img.RawManifest(); err != nil {
		return p, fmt.Errorf("read manifest: %w", err)
	}
	mt, err := img.MediaType()
	if err != nil {
		return p, fmt.Errorf("read media type: %w", err)
	}
	if p.digest, err = img.Digest(); err != nil {
		return p, fmt.Errorf("read digest: %w", err)
	}
	if p.rawConfig, err = img.RawConfigFile(); err != nil {
		return p, fmt.Errorf("read config: %w", err)
	}
	if p.configName, err = img.ConfigName(); err != nil {
		return p, fmt.Errorf("read config digest: %w", err)
	}
	desc := v1.Descriptor{
		MediaType:   mt,
		Size:        int64(len(p.rawManifest)),
		Digest:      p.digest,
		Annotations: refAnnotations(ref),
	}
	if cf, err := img.ConfigFile(); err == nil {
		desc.Platform = cf.Platform()
	}
	if p.index, err = json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests:     []v1.Descriptor{desc},
	}); err != nil {
		return p, fmt.Errorf("encode index: %w", err)
	}
	if p.layers, err = img.Layers(); err != nil {
		return p, fmt.Errorf("read layers: %w", err)
	}
	return p, nil
}

// archiveWriter writes the entries of an OCI archive, each with the same
// mode and a zero time, so that an image makes the same archive every
// time.
type archiveWriter struct {
	tw *tar.Writer
}

// archiveEpoch is every entry's modification time.
var archiveEpoch = time.Unix(0, 0)

// dir writes a directory entry.
func (a archiveWriter) dir(name string) error {
	return a.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: archiveEpoch})
}

// file writes a file entry of size bytes read from r, and fails when r
// holds fewer.
func (a archiveWriter) file(name string, size int64, r io.Reader) error {
	if err := a.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: archiveEpoch}); err != nil {
		return err
	}
	n, err := io.Copy(a.tw, r)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if n != size {
		return fmt.Errorf("%s: wrote %d bytes, want %d; did the file change?", name, n, size)
	}
	return nil
}

// bytesFile writes a file entry holding b.
func (a archiveWriter) bytesFile(name string, b []byte) error {
	return a.file(name, int64(len(b)), bytes.NewReader(b))
}

// layers streams each distinct layer's compressed blob into its entry.
func (a archiveWriter) layers(layers []v1.Layer) error {
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
		err = a.file(archiveBlob(d), size, rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// archiveBlob is the entry of the blob of digest h.
func archiveBlob(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// refAnnotations names an image ref in an OCI index, for the layout and
// for containerd.
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
