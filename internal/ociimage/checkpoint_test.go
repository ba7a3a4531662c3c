package ociimage

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func TestCheckpointImage(t *testing.T) {
	plain, plainBytes := fakeCheckpointArchive(t)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(plainBytes); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	gzPath := filepath.Join(t.TempDir(), "checkpoint.tar.gz")
	if err := os.WriteFile(gzPath, gz.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := map[string]struct {
		archive       string
		archiveBytes  []byte
		wantMediaType types.MediaType
	}{
		"uncompressed archive": {archive: plain, archiveBytes: plainBytes, wantMediaType: types.OCIUncompressedLayer},
		"gzip archive":         {archive: gzPath, archiveBytes: gz.Bytes(), wantMediaType: types.OCILayer},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			img, err := Checkpoint(tc.archive, "counter")
			if err != nil {
				t.Fatalf("Checkpoint: %v", err)
			}
			m, err := img.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			wantAnn := map[string]string{
				"org.criu.checkpoint.container.name":              "counter",
				"io.kubernetes.cri-o.annotations.checkpoint.name": "counter",
			}
			if diff := cmp.Diff(wantAnn, m.Annotations); diff != "" {
				t.Errorf("manifest annotations (-want +got):\n%s", diff)
			}
			if m.MediaType != types.OCIManifestSchema1 {
				t.Errorf("manifest media type = %q, want %q", m.MediaType, types.OCIManifestSchema1)
			}
			if len(m.Layers) != 1 {
				t.Fatalf("layers = %d, want 1", len(m.Layers))
			}
			wantDigest := v1.Hash{Algorithm: "sha256", Hex: sha256Hex(tc.archiveBytes)}
			if d := m.Layers[0]; d.MediaType != tc.wantMediaType || d.Digest != wantDigest || d.Size != int64(len(tc.archiveBytes)) {
				t.Errorf("layer descriptor = %s %s %d; want %s %s %d", d.MediaType, d.Digest, d.Size,
					tc.wantMediaType, wantDigest, len(tc.archiveBytes))
			}

			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			rc, err := layers[0].Compressed()
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.archiveBytes) {
				t.Errorf("layer blob (%d bytes) is not the archive (%d bytes) byte for byte", len(got), len(tc.archiveBytes))
			}

			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if !cf.Platform().Equals(HostPlatform()) {
				t.Errorf("platform = %s, want %s", cf.Platform(), HostPlatform())
			}
			wantDiffID := v1.Hash{Algorithm: "sha256", Hex: sha256Hex(plainBytes)}
			if len(cf.RootFS.DiffIDs) != 1 || cf.RootFS.DiffIDs[0] != wantDiffID {
				t.Errorf("rootfs diff_ids = %v, want [%s] (the uncompressed archive)", cf.RootFS.DiffIDs, wantDiffID)
			}
		})
	}
}

func TestCheckpointDigestIsStable(t *testing.T) {
	p, _ := fakeCheckpointArchive(t)
	a, err := Checkpoint(p, "counter")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Checkpoint(p, "counter")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Checkpoint(p, "other")
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	dc, _ := c.Digest()
	if da != db {
		t.Errorf("same archive gave digests %s and %s", da, db)
	}
	if da == dc {
		t.Errorf("another container name gave the same digest %s", da)
	}
}

func TestCheckpointErrors(t *testing.T) {
	p, _ := fakeCheckpointArchive(t)
	tests := map[string]struct {
		archive, container string
		wantErr            string
	}{
		"no container name": {archive: p, wantErr: "empty container name"},
		"missing archive":   {archive: "/nonexistent/cp.tar", container: "c", wantErr: "/nonexistent/cp.tar"},
		"directory":         {archive: t.TempDir(), container: "c", wantErr: "not a regular file"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Checkpoint(tc.archive, tc.container)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Checkpoint error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
