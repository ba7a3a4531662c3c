package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// layerEntry is one entry of a layer this package writes. A regular file
// has its bytes in data or, when source is set, in that host file, read
// when the layer is written.
type layerEntry struct {
	hdr    tar.Header
	data   []byte
	source string
}

// baseEntries are the files every image of this package has: /etc/passwd
// and /etc/group with the nonroot user, and a /tmp with mode 1777 owned by
// tmpUID:tmpGID.
func baseEntries(tmpUID, tmpGID int) []layerEntry {
	return []layerEntry{
		dirEntry("etc/", 0o755, 0, 0),
		fileEntry("etc/group", 0o644, []byte(groupFile)),
		fileEntry("etc/passwd", 0o644, []byte(passwdFile)),
		dirEntry("tmp/", 0o1777, tmpUID, tmpGID),
	}
}

func dirEntry(name string, mode int64, uid, gid int) layerEntry {
	return layerEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: gid}}
}

func fileEntry(name string, mode int64, data []byte) layerEntry {
	return layerEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}, data: data}
}

// writeLayerTar writes entries as a tar sorted by name, every entry with
// the time mtime. The same entries and time give the same bytes. Host
// files are read here, once, so that the layer is a snapshot of them.
func writeLayerTar(entries []layerEntry, mtime time.Time) ([]byte, error) {
	entries = append([]layerEntry(nil), entries...)
	sort.Slice(entries, func(i, j int) bool { return entries[i].hdr.Name < entries[j].hdr.Name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		h.ModTime = mtime
		data := e.data
		if e.source != "" {
			var err error
			if data, err = os.ReadFile(e.source); err != nil {
				return nil, fmt.Errorf("%s: %w", h.Name, err)
			}
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("%s: %w", h.Name, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("%s: %w", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// layerFromTar makes an OCI layer of an uncompressed tar held in memory.
// cacheCompressed keeps the compressed bytes after the first compression,
// which saves recompressing a large layer for every write.
func layerFromTar(data []byte, cacheCompressed bool) (v1.Layer, error) {
	opts := []tarball.LayerOption{tarball.WithMediaType(types.OCILayer)}
	if cacheCompressed {
		opts = append(opts, tarball.WithCompressedCaching)
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, opts...)
}

// tarMode is the tar header mode of a host file mode: the permission bits
// with setuid, setgid and sticky.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}
