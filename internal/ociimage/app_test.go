package ociimage

import (
	"archive/tar"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func TestAppConfigAndLayer(t *testing.T) {
	sidecar := staticBinary(t, "sidecar")
	helper := staticBinary(t, "helper")
	img, err := App(AppOptions{
		Binaries: []string{sidecar, helper},
		Env:      []string{"LOG_LEVEL=debug"},
		Labels:   map[string]string{"org.opencontainers.image.title": "sidecar"},
	})
	if err != nil {
		t.Fatalf("App: %v", err)
	}

	mt, err := img.MediaType()
	if err != nil || mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type = %q, %v; want %q", mt, err, types.OCIManifestSchema1)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	wantCfg := v1.Config{
		Entrypoint: []string{"/sidecar"},
		User:       "65532:65532",
		Env:        []string{DefaultPath, "LOG_LEVEL=debug"},
		WorkingDir: "/",
		Labels:     map[string]string{"org.opencontainers.image.title": "sidecar"},
	}
	if diff := cmp.Diff(wantCfg, cf.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if got := cf.Platform().String(); got != "linux/amd64" {
		t.Errorf("platform = %s, want linux/amd64", got)
	}
	if !cf.Created.Equal(time.Unix(0, 0)) {
		t.Errorf("created = %v, want the Unix epoch", cf.Created.Time)
	}

	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers = %d, %v; want 1", len(layers), err)
	}
	if lmt, _ := layers[0].MediaType(); lmt != types.OCILayer {
		t.Errorf("layer media type = %q, want %q", lmt, types.OCILayer)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	binSum := sha256Hex(mustRead(t, sidecar))
	want := []tarEntry{
		{Name: "etc/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "etc/group", Type: tar.TypeReg, Mode: 0o644, SHA256: sha256Hex([]byte(groupFile))},
		{Name: "etc/passwd", Type: tar.TypeReg, Mode: 0o644, SHA256: sha256Hex([]byte(passwdFile))},
		{Name: "helper", Type: tar.TypeReg, Mode: 0o755, SHA256: binSum},
		{Name: "sidecar", Type: tar.TypeReg, Mode: 0o755, SHA256: binSum},
		{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777, UID: 65532, GID: 65532},
	}
	if diff := cmp.Diff(want, readTar(t, rc)); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
	if !strings.Contains(passwdFile, "nonroot:x:65532:65532:") || !strings.Contains(groupFile, "nonroot:x:65532:") {
		t.Errorf("passwd/group lack the nonroot user:\n%s%s", passwdFile, groupFile)
	}
}

func TestAppDigestIsReproducible(t *testing.T) {
	bin := staticBinary(t, "consumer")
	digest := func(opts AppOptions) v1.Hash {
		t.Helper()
		img, err := App(opts)
		if err != nil {
			t.Fatalf("App: %v", err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a := digest(AppOptions{Binaries: []string{bin}})
	// A copy with another mtime and path but the same name and bytes.
	other := filepath.Join(t.TempDir(), "consumer")
	if err := os.WriteFile(other, mustRead(t, bin), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(other, time.Now(), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if b := digest(AppOptions{Binaries: []string{other}}); a != b {
		t.Errorf("same binary gave digests %s and %s", a, b)
	}
	if c := digest(AppOptions{Binaries: []string{bin}, Created: time.Unix(1700000000, 0)}); c == a {
		t.Errorf("another Created time gave the same digest %s", c)
	}
}

func TestAppPauseUser(t *testing.T) {
	img, err := App(AppOptions{Binaries: []string{staticBinary(t, "pause")}, User: "0:0"})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "0:0" || cf.Config.Entrypoint[0] != "/pause" {
		t.Errorf("user %q entrypoint %q; want 0:0 and /pause", cf.Config.User, cf.Config.Entrypoint)
	}
}

func TestAppErrors(t *testing.T) {
	bin := staticBinary(t, "app")
	sameName := staticBinary(t, "app")
	text := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(text, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dynamic := "" // a dynamically linked system binary, if there is one
	for _, p := range []string{"/bin/true", "/usr/bin/true", "/bin/ls"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if err := checkStatic(b, "amd64"); err != nil && strings.Contains(err.Error(), "dynamically") {
			dynamic = p
			break
		}
	}
	tests := map[string]struct {
		opts    AppOptions
		wantErr string
	}{
		"no binaries":      {opts: AppOptions{}, wantErr: "no binaries"},
		"missing file":     {opts: AppOptions{Binaries: []string{"/nonexistent/x"}}, wantErr: "/nonexistent/x"},
		"not an ELF":       {opts: AppOptions{Binaries: []string{text}}, wantErr: "not an ELF"},
		"same basename":    {opts: AppOptions{Binaries: []string{bin, sameName}}, wantErr: "both land at /app"},
		"bad group":        {opts: AppOptions{Binaries: []string{bin}, User: "1000:staff"}, wantErr: "group must be a number"},
		"dynamic binary":   {opts: AppOptions{Binaries: []string{dynamic}}, wantErr: "CGO_ENABLED=0"},
		"named user is ok": {opts: AppOptions{Binaries: []string{bin}, User: "nonroot"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if name == "dynamic binary" && dynamic == "" {
				t.Skip("no dynamically linked binary on this machine")
			}
			_, err := App(tc.opts)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("App: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("App error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestParseNumericUser(t *testing.T) {
	tests := map[string]struct {
		user     string
		uid, gid int
		wantErr  bool
	}{
		"uid and gid":  {user: "65532:65532", uid: 65532, gid: 65532},
		"uid only":     {user: "1000", uid: 1000, gid: 1000},
		"root":         {user: "0:0"},
		"name":         {user: "nonroot"},
		"name and grp": {user: "nonroot:nonroot"},
		"bad gid":      {user: "1000:x", wantErr: true},
		"negative":     {user: "-1", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			uid, gid, err := parseNumericUser(tc.user)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseNumericUser(%q) error = %v, wantErr %v", tc.user, err, tc.wantErr)
			}
			if uid != tc.uid || gid != tc.gid {
				t.Errorf("parseNumericUser(%q) = %d, %d; want %d, %d", tc.user, uid, gid, tc.uid, tc.gid)
			}
		})
	}
}

func TestWithPath(t *testing.T) {
	tests := map[string]struct {
		env, want []string
	}{
		"empty":       {env: nil, want: []string{DefaultPath}},
		"adds path":   {env: []string{"A=1"}, want: []string{DefaultPath, "A=1"}},
		"user's wins": {env: []string{"PATH=/bin"}, want: []string{"PATH=/bin"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, withPath(tc.env)); diff != "" {
				t.Errorf("withPath (-want +got):\n%s", diff)
			}
		})
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
