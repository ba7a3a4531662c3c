package ociimage

import (
	"archive/tar"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// hostTree writes a small tree under a temporary directory and returns
// its path:
//
//	data/a.txt              0640
//	data/bin/tool           0755
//	data/link-in   -> a.txt
//	data/link-abs  -> <root>/data/bin/tool
//	data/link-out  -> ../outside.txt
//	data/chain     -> link-out
//	data/__pycache__/x.pyc
//	data/skip.txt
//	outside.txt             0600
//	alias          -> data
//	other/d.txt
func hostTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]struct {
		mode fs.FileMode
		data string
	}{
		"data/a.txt":             {0o640, "a"},
		"data/bin/tool":          {0o755, "tool"},
		"data/__pycache__/x.pyc": {0o644, "pyc"},
		"data/skip.txt":          {0o644, "skip"},
		"outside.txt":            {0o600, "outside"},
		"other/d.txt":            {0o644, "d"},
	}
	for name, f := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"data/link-in":  "a.txt",
		"data/link-abs": filepath.Join(root, "data/bin/tool"),
		"data/link-out": "../outside.txt",
		"data/chain":    "link-out",
		"alias":         "data",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func skipTestFiles(hostPath string, d fs.DirEntry) bool {
	return d.Name() == "__pycache__" || d.Name() == "skip.txt"
}

func TestFilesLayer(t *testing.T) {
	root := hostTree(t)
	img, err := Files(FilesOptions{
		// alias/bin/tool crosses the alias symlink and names a file that
		// data brings too.
		Paths: []string{filepath.Join(root, "data"), filepath.Join(root, "alias/bin/tool")},
		Skip:  skipTestFiles,
		Files: []File{{Path: "/app/run.py", Mode: 0o755, Data: []byte("print(1)\n")}, {Path: "/app/conf/x.json", Data: []byte("{}")}},
	})
	if err != nil {
		t.Fatalf("Files: %v", err)
	}
	entries := layerEntries(t, img)

	prefix := strings.TrimPrefix(root, "/") + "/"
	var under, rest []tarEntry
	for _, e := range entries {
		if strings.HasPrefix(e.Name, prefix) && e.Name != prefix {
			e.Name = strings.TrimPrefix(e.Name, prefix)
			under = append(under, e)
		} else {
			rest = append(rest, e)
		}
	}
	wantUnder := []tarEntry{
		{Name: "alias", Type: tar.TypeSymlink, Mode: 0o777, Link: "data"},
		{Name: "data/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "data/a.txt", Type: tar.TypeReg, Mode: 0o640, SHA256: sha256Hex([]byte("a"))},
		{Name: "data/bin/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "data/bin/tool", Type: tar.TypeReg, Mode: 0o755, SHA256: sha256Hex([]byte("tool"))},
		{Name: "data/chain", Type: tar.TypeSymlink, Mode: 0o777, Link: "link-out"},
		{Name: "data/link-abs", Type: tar.TypeSymlink, Mode: 0o777, Link: filepath.Join(root, "data/bin/tool")},
		{Name: "data/link-in", Type: tar.TypeSymlink, Mode: 0o777, Link: "a.txt"},
		// Its target is not in the image: the file it resolves to takes its place.
		{Name: "data/link-out", Type: tar.TypeReg, Mode: 0o600, SHA256: sha256Hex([]byte("outside"))},
	}
	if diff := cmp.Diff(wantUnder, under); diff != "" {
		t.Errorf("entries under the host tree (-want +got):\n%s", diff)
	}

	// The rest: the base files, the in-memory files with their parents, and
	// the parents of the host tree with the host's modes.
	wantRest := []tarEntry{
		{Name: "app/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "app/conf/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "app/conf/x.json", Type: tar.TypeReg, Mode: 0o644, SHA256: sha256Hex([]byte("{}"))},
		{Name: "app/run.py", Type: tar.TypeReg, Mode: 0o755, SHA256: sha256Hex([]byte("print(1)\n"))},
		{Name: "etc/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "etc/group", Type: tar.TypeReg, Mode: 0o644, SHA256: sha256Hex([]byte(groupFile))},
		{Name: "etc/passwd", Type: tar.TypeReg, Mode: 0o644, SHA256: sha256Hex([]byte(passwdFile))},
	}
	for dir := root; dir != "/"; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if dir == "/tmp" { // the image's own /tmp wins
			wantRest = append(wantRest, tarEntry{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777, UID: 65532, GID: 65532})
			continue
		}
		wantRest = append(wantRest, tarEntry{Name: strings.TrimPrefix(dir, "/") + "/", Type: tar.TypeDir, Mode: tarMode(fi.Mode())})
	}
	if !strings.HasPrefix(root, "/tmp/") {
		wantRest = append(wantRest, tarEntry{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777, UID: 65532, GID: 65532})
	}
	slices.SortFunc(wantRest, func(a, b tarEntry) int { return strings.Compare(a.Name, b.Name) })
	if diff := cmp.Diff(wantRest, rest); diff != "" {
		t.Errorf("other entries (-want +got):\n%s", diff)
	}
}

func TestFilesConfig(t *testing.T) {
	root := hostTree(t)
	img, err := Files(FilesOptions{
		Paths:      []string{filepath.Join(root, "data/a.txt")},
		Entrypoint: []string{"/usr/bin/python3", "/app/run.py"},
		Cmd:        []string{"-v"},
		Env:        []string{"PYTHONUNBUFFERED=1"},
		WorkingDir: "/app",
		Labels:     map[string]string{"org.opencontainers.image.title": "py"},
	})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	want := v1.Config{
		Entrypoint: []string{"/usr/bin/python3", "/app/run.py"},
		Cmd:        []string{"-v"},
		User:       NonRootUser,
		Env:        []string{DefaultPath, "PYTHONUNBUFFERED=1"},
		WorkingDir: "/app",
		Labels:     map[string]string{"org.opencontainers.image.title": "py"},
	}
	if diff := cmp.Diff(want, cf.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if got := cf.Platform().String(); got != "linux/amd64" {
		t.Errorf("platform = %s, want linux/amd64", got)
	}

	img, err = Files(FilesOptions{Paths: []string{filepath.Join(root, "data/a.txt")}, User: "0:0"})
	if err != nil {
		t.Fatal(err)
	}
	if cf, _ := img.ConfigFile(); cf.Config.User != "0:0" || cf.Config.WorkingDir != "/" {
		t.Errorf("user %q, working dir %q; want 0:0 and /", cf.Config.User, cf.Config.WorkingDir)
	}
	for _, e := range layerEntries(t, img) {
		if e.Name == "tmp/" && (e.UID != 0 || e.GID != 0) {
			t.Errorf("/tmp of a root image is owned by %d:%d, want 0:0", e.UID, e.GID)
		}
	}
}

func TestFilesDigestIsReproducible(t *testing.T) {
	root := hostTree(t)
	digest := func() v1.Hash {
		t.Helper()
		img, err := Files(FilesOptions{Paths: []string{filepath.Join(root, "data")}, Skip: skipTestFiles})
		if err != nil {
			t.Fatalf("Files: %v", err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a := digest()
	if b := digest(); a != b {
		t.Fatalf("the same tree gave digests %s and %s", a, b)
	}
	old := time.Now().Add(-48 * time.Hour)
	for _, p := range []string{"data", "data/a.txt", "data/bin/tool"} {
		if err := os.Chtimes(filepath.Join(root, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if b := digest(); a != b {
		t.Errorf("new mtimes changed the digest from %s to %s", a, b)
	}
	if err := os.WriteFile(filepath.Join(root, "data/a.txt"), []byte("b"), 0o640); err != nil {
		t.Fatal(err)
	}
	if b := digest(); a == b {
		t.Errorf("new content kept the digest %s", a)
	}
}

func TestFilesErrors(t *testing.T) {
	root := hostTree(t)
	if err := os.Symlink("../other", filepath.Join(root, "data/dir-out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("nowhere", filepath.Join(root, "dangling")); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(root, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	data := filepath.Join(root, "data")

	tests := map[string]struct {
		opts    FilesOptions
		wantErr string
	}{
		"no paths":             {opts: FilesOptions{}, wantErr: "no paths"},
		"relative path":        {opts: FilesOptions{Paths: []string{"usr/bin"}}, wantErr: "not absolute"},
		"missing path":         {opts: FilesOptions{Paths: []string{filepath.Join(root, "nope")}}, wantErr: "nope"},
		"directory link out":   {opts: FilesOptions{Paths: []string{data}}, wantErr: "points to directory " + filepath.Join(root, "other")},
		"dangling link":        {opts: FilesOptions{Paths: []string{filepath.Join(root, "dangling")}}, wantErr: "dangling -> nowhere"},
		"socket":               {opts: FilesOptions{Paths: []string{sock}}, wantErr: "cannot hold"},
		"host passwd":          {opts: FilesOptions{Paths: []string{"/etc/passwd"}}, wantErr: "would replace the image's own /etc/passwd"},
		"in-memory over host":  {opts: FilesOptions{Paths: []string{filepath.Join(data, "a.txt")}, Files: []File{{Path: filepath.Join(data, "a.txt")}}}, wantErr: "both host " + filepath.Join(data, "a.txt") + " and an in-memory file"},
		"in-memory under file": {opts: FilesOptions{Paths: []string{filepath.Join(data, "a.txt")}, Files: []File{{Path: filepath.Join(data, "a.txt", "x")}}}, wantErr: "is not a directory in the image"},
		"relative in-memory":   {opts: FilesOptions{Paths: []string{filepath.Join(data, "a.txt")}, Files: []File{{Path: "app/x"}}}, wantErr: "clean absolute path"},
		"bad user":             {opts: FilesOptions{Paths: []string{filepath.Join(data, "a.txt")}, User: "1000:staff"}, wantErr: "group must be a number"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Files(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Files error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func layerEntries(t *testing.T, img v1.Image) []tarEntry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers = %d, %v; want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	return readTar(t, rc)
}
