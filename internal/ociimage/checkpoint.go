package ociimage

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// AnnotationCheckpointContainerd names the checkpointed container in a
	// checkpoint image's manifest. containerd's CRI plugin recognises a
	// checkpoint image by this key (checkpointctl's CheckpointAnnotationName).
	AnnotationCheckpointContainerd = "org.criu.checkpoint.container.name"
	// AnnotationCheckpointCRIO is the same for CRI-O.
	AnnotationCheckpointCRIO = "io.kubernetes.cri-o.annotations.checkpoint.name"
)

// Checkpoint builds a checkpoint image from a kubelet checkpoint archive
// (checkpoint-<pod>_<namespace>-<container>-<time>.tar). Its only layer is
// the archive byte for byte: an uncompressed archive gets the media type
// application/vnd.oci.image.layer.v1.tar, a gzip or zstd one the matching
// compressed type. Its config is linux on this machine's architecture (the
// node agent builds it on the checkpointed node, and CRIU restores it only
// on a node of the same architecture) and its manifest carries both
// AnnotationCheckpointContainerd and AnnotationCheckpointCRIO naming
// containerName. The archive is read twice to hash it and is never held in
// memory, so it must not change until the image has been written or pushed.
func Checkpoint(archivePath, containerName string) (v1.Image, error) {
	if containerName == "" {
		return nil, errors.New("checkpoint image: empty container name; pass the name of the checkpointed container")
	}
	layer, err := archiveLayer(archivePath)
	if err != nil {
		return nil, fmt.Errorf("checkpoint image: %w", err)
	}
	created := time.Unix(0, 0).UTC()
	img, err := assemble(layer, HostPlatform().Architecture, v1.Config{}, created, "ociimage.Checkpoint: "+containerName, map[string]string{
		AnnotationCheckpointContainerd: containerName,
		AnnotationCheckpointCRIO:       containerName,
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint image of %s: %w", archivePath, err)
	}
	return img, nil
}

// archiveLayer returns the file as a layer without recompressing it.
func archiveLayer(path string) (v1.Layer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open archive: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat archive: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("archive %s is not a regular file", path)
	}
	magic := make([]byte, 4)
	n, err := io.ReadFull(f, magic)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read archive %s: %w", path, err)
	}
	magic = magic[:n]
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		return tarball.LayerFromOpener(opener, tarball.WithMediaType(types.OCILayer))
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return tarball.LayerFromOpener(opener, tarball.WithMediaType(types.OCILayerZStd))
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read archive %s: %w", path, err)
	}
	h := sha256.New()
	size, err := io.Copy(h, bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("hash archive %s: %w", path, err)
	}
	digest := v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", h.Sum(nil))}
	return &fileLayer{path: path, digest: digest, size: size}, nil
}

// fileLayer is an uncompressed tar on disk used as a layer as it is: its
// digest and diff ID are both the file's SHA-256.
type fileLayer struct {
	path   string
	digest v1.Hash
	size   int64
}

var _ v1.Layer = (*fileLayer)(nil)

func (l *fileLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) Size() (int64, error)                 { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error)  { return types.OCIUncompressedLayer, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)   { return l.open() }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) { return l.open() }
func (l *fileLayer) open() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, fmt.Errorf("open layer archive: %w", err)
	}
	return f, nil
}
