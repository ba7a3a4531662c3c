package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	buildMu  sync.Mutex
	builtFor = map[string][]byte{} // by GOARCH
)

// staticBinary builds a tiny static linux/amd64 Go program once per test
// binary and writes a copy named name into a temporary directory.
func staticBinary(t *testing.T, name string) string {
	t.Helper()
	return staticBinaryFor(t, name, "amd64")
}

// staticBinaryFor is staticBinary for the architecture arch (a GOARCH).
func staticBinaryFor(t *testing.T, name, arch string) string {
	t.Helper()
	bin, err := helloFor(arch)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// helloFor builds the tiny program for arch, once per test binary.
func helloFor(arch string) ([]byte, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := builtFor[arch]; ok {
		return bin, nil
	}
	dir, err := os.MkdirTemp("", "ociimage-hello-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src := "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello from an ociimage test\") }\n"
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "hello")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOWORK=off", "GO111MODULE=off")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build test binary for %s: %w\n%s", arch, err, msg)
	}
	bin, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	builtFor[arch] = bin
	return bin, nil
}

// tarEntry is what the tests compare of a tar header and its content.
type tarEntry struct {
	Name     string
	Type     byte
	Mode     int64
	UID, GID int
	ModTime  int64
	SHA256   string
	Link     string
}

func readTar(t *testing.T, r io.Reader) []tarEntry {
	t.Helper()
	var out []tarEntry
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("read tar: %v", err)
		}
		sum := sha256.New()
		if _, err := io.Copy(sum, tr); err != nil {
			t.Fatalf("read tar entry %s: %v", h.Name, err)
		}
		e := tarEntry{Name: h.Name, Type: h.Typeflag, Mode: h.Mode, UID: h.Uid, GID: h.Gid, ModTime: h.ModTime.Unix(), Link: h.Linkname}
		if h.Typeflag == tar.TypeReg {
			e.SHA256 = hex.EncodeToString(sum.Sum(nil))
		}
		out = append(out, e)
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// fakeCheckpointArchive writes a small tar shaped like a kubelet checkpoint
// archive and returns its path and bytes.
func fakeCheckpointArchive(t *testing.T) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files := []struct {
		name string
		data []byte
	}{
		{"config.dump", []byte(`{"id":"abc","name":"counter"}`)},
		{"spec.dump", []byte(`{"ociVersion":"1.2.0"}`)},
		{"checkpoint/pages-1.img", bytes.Repeat([]byte{0xAB, 0x01}, 40000)},
		{"rootfs-diff.tar", nil},
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o600, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "checkpoint-counter_default-counter-2026-01-02T03:04:05Z.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, buf.Bytes()
}
