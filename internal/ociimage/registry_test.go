package ociimage

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func startRegistry(t *testing.T, dir string) *Registry {
	t.Helper()
	r, err := ServeRegistry("127.0.0.1:0", dir)
	if err != nil {
		t.Fatalf("ServeRegistry: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func pull(t *testing.T, ref string) v1.Image {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	return img
}

func TestPushPullApp(t *testing.T) {
	reg := startRegistry(t, t.TempDir())
	img, err := App(AppOptions{Binaries: []string{staticBinary(t, "sidecar")}})
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Addr() + "/ms2m/sidecar:dev"
	if err := Push(t.Context(), img, ref, PushOptions{Insecure: true}); err != nil {
		t.Fatalf("Push: %v", err)
	}
	got := pull(t, ref)
	want, _ := img.Digest()
	if d, err := got.Digest(); err != nil || d != want {
		t.Errorf("pulled digest = %s, %v; want %s", d, err, want)
	}
	sameImageContent(t, img, got)
	// By digest too.
	if d, _ := pull(t, reg.Addr()+"/ms2m/sidecar@"+want.String()).Digest(); d != want {
		t.Errorf("pull by digest gave %s, want %s", d, want)
	}
}

func TestPushPullCheckpointFromDisk(t *testing.T) {
	dir := t.TempDir()
	reg := startRegistry(t, dir)
	archive, archiveBytes := fakeCheckpointArchive(t)
	img, err := Checkpoint(archive, "counter")
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Addr() + "/ms2m/counter-checkpoint:v1"
	if err := Push(t.Context(), img, ref, PushOptions{}); err != nil {
		t.Fatalf("Push: %v", err)
	}
	got := pull(t, ref)
	m, err := got.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Annotations[AnnotationCheckpointContainerd] != "counter" || m.Annotations[AnnotationCheckpointCRIO] != "counter" {
		t.Errorf("pulled manifest annotations = %v", m.Annotations)
	}
	layers, _ := got.Layers()
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	pulled, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(pulled, archiveBytes) {
		t.Errorf("pulled layer differs from the archive")
	}
	// The blob is a file under dir, not a buffer.
	onDisk, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", sha256Hex(archiveBytes)))
	if err != nil || !bytes.Equal(onDisk, archiveBytes) {
		t.Errorf("blob on disk: %d bytes, %v; want the archive", len(onDisk), err)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, "uploads")); len(left) != 0 {
		t.Errorf("uploads left behind: %v", left)
	}
}

func TestRegistryKeepsImagesAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	reg, err := ServeRegistry("127.0.0.1:0", dir)
	if err != nil {
		t.Fatal(err)
	}
	img, err := App(AppOptions{Binaries: []string{staticBinary(t, "webhook")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := Push(t.Context(), img, reg.Addr()+"/ms2m/webhook:dev", PushOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := reg.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	again := startRegistry(t, dir)
	got := pull(t, again.Addr()+"/ms2m/webhook:dev")
	want, _ := img.Digest()
	if d, _ := got.Digest(); d != want {
		t.Errorf("after restart digest = %s, want %s", d, want)
	}
	sameImageContent(t, img, got)
}

// TestUploadProtocol drives the blob upload endpoints by hand: chunks with
// Content-Range, a wrong range, a digest mismatch, a monolithic upload and
// a cross-repository mount.
func TestUploadProtocol(t *testing.T) {
	reg := startRegistry(t, t.TempDir())
	base := "http://" + reg.Addr()
	blob := bytes.Repeat([]byte("checkpoint-bytes "), 1000)
	digest := "sha256:" + sha256Hex(blob)

	do := func(method, url string, body []byte, hdr map[string]string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, url, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatalf("read the body of %s %s: %v", method, url, err)
		}
		resp.Body.Close()
		return resp
	}
	expect := func(resp *http.Response, status int, what string) {
		t.Helper()
		if resp.StatusCode != status {
			t.Fatalf("%s: status %d, want %d", what, resp.StatusCode, status)
		}
	}

	resp := do("POST", base+"/v2/a/b/blobs/uploads/", nil, nil)
	expect(resp, http.StatusAccepted, "start upload")
	loc := base + resp.Header.Get("Location")
	half := len(blob) / 2
	expect(do("PATCH", loc, blob[:half], map[string]string{"Content-Range": fmt.Sprintf("0-%d", half-1)}), http.StatusAccepted, "first chunk")
	resp = do("PATCH", loc, blob[half:], map[string]string{"Content-Range": "5-9"})
	expect(resp, http.StatusRequestedRangeNotSatisfiable, "chunk at a wrong offset")
	if got, want := resp.Header.Get("Range"), fmt.Sprintf("0-%d", half-1); got != want {
		t.Errorf("Range after a wrong chunk = %q, want %q", got, want)
	}
	resp = do("GET", loc, nil, nil)
	expect(resp, http.StatusNoContent, "upload status")
	expect(do("PATCH", loc, blob[half:], map[string]string{"Content-Range": fmt.Sprintf("%d-%d", half, len(blob)-1)}), http.StatusAccepted, "second chunk")
	resp = do("PUT", loc+"?digest="+digest, nil, nil)
	expect(resp, http.StatusCreated, "finish upload")
	if resp.Header.Get("Docker-Content-Digest") != digest {
		t.Errorf("Docker-Content-Digest = %q, want %q", resp.Header.Get("Docker-Content-Digest"), digest)
	}

	resp, err := http.Get(base + "/v2/a/b/blobs/" + digest)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, blob) {
		t.Errorf("GET blob: status %d, %d bytes; want 200 and the blob", resp.StatusCode, len(got))
	}
	req, _ := http.NewRequest("GET", base+"/v2/a/b/blobs/"+digest, nil)
	req.Header.Set("Range", "bytes=10-19")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, blob[10:20]) {
		t.Errorf("ranged GET: status %d, %q; want 206 and %q", resp.StatusCode, got, blob[10:20])
	}

	// A digest that does not match the bytes is refused and stores nothing.
	resp = do("POST", base+"/v2/a/b/blobs/uploads/", nil, nil)
	loc = base + resp.Header.Get("Location")
	wrong := "sha256:" + sha256Hex([]byte("something else"))
	expect(do("PUT", loc+"?digest="+wrong, blob, nil), http.StatusBadRequest, "digest mismatch")
	expect(do("HEAD", base+"/v2/a/b/blobs/"+wrong, nil, nil), http.StatusNotFound, "HEAD of the refused blob")
	expect(do("GET", loc, nil, nil), http.StatusNotFound, "status of the refused upload")

	// Monolithic upload in the POST.
	small := []byte("small blob")
	smallDigest := "sha256:" + sha256Hex(small)
	expect(do("POST", base+"/v2/c/blobs/uploads/?digest="+smallDigest, small, nil), http.StatusCreated, "monolithic upload")
	expect(do("POST", base+"/v2/c/blobs/uploads/?digest="+wrong, small, nil), http.StatusBadRequest, "monolithic mismatch")

	// Mount of a blob the registry has; of one it lacks, a normal upload.
	expect(do("POST", base+"/v2/d/blobs/uploads/?mount="+digest+"&from=a/b", nil, nil), http.StatusCreated, "mount")
	expect(do("POST", base+"/v2/d/blobs/uploads/?mount="+wrong+"&from=a/b", nil, nil), http.StatusAccepted, "mount of a missing blob")
	resp = do("HEAD", base+"/v2/d/blobs/"+digest, nil, nil)
	expect(resp, http.StatusOK, "HEAD mounted blob")
	if resp.ContentLength != int64(len(blob)) {
		t.Errorf("HEAD Content-Length = %d, want %d", resp.ContentLength, len(blob))
	}
	expect(do("PATCH", base+"/v2/a/b/blobs/uploads/nope", []byte("x"), nil), http.StatusNotFound, "PATCH of an unknown upload")
}

func TestParseUploadPath(t *testing.T) {
	tests := map[string]struct {
		path     string
		repo, id string
		ok       bool
	}{
		"start":          {path: "/v2/ms2m/sidecar/blobs/uploads/", repo: "ms2m/sidecar", ok: true},
		"start no slash": {path: "/v2/pause/blobs/uploads", repo: "pause", ok: true},
		"with id":        {path: "/v2/a/b/c/blobs/uploads/1234", repo: "a/b/c", id: "1234", ok: true},
		"blob":           {path: "/v2/a/blobs/sha256:00", ok: false},
		"manifest":       {path: "/v2/a/manifests/latest", ok: false},
		"no repo":        {path: "/v2/blobs/uploads/", ok: false},
		"not v2":         {path: "/blobs/uploads/", ok: false},
		"deeper":         {path: "/v2/a/blobs/uploads/1/2", ok: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			repo, id, ok := parseUploadPath(tc.path)
			if ok != tc.ok || (ok && (repo != tc.repo || id != tc.id)) {
				t.Errorf("parseUploadPath(%q) = %q, %q, %v; want %q, %q, %v", tc.path, repo, id, ok, tc.repo, tc.id, tc.ok)
			}
		})
	}
}

func TestParseDockerConfig(t *testing.T) {
	basic := base64.StdEncoding.EncodeToString([]byte("ci:s3cret"))
	cfg := `{"auths":{
		"https://127.0.0.1:5000/v1/": {"auth": "` + basic + `"},
		"registry.local:443": {"username": "u", "password": "p"},
		"tokens.local": {"identitytoken": "tok"},
		"broken.local": {"auth": "!!"}}}`
	tests := map[string]struct {
		host    string
		want    authn.AuthConfig
		wantErr string
	}{
		"auth field with scheme and path": {host: "127.0.0.1:5000", want: authn.AuthConfig{Username: "ci", Password: "s3cret"}},
		"username and password":           {host: "registry.local:443", want: authn.AuthConfig{Username: "u", Password: "p"}},
		"identity token":                  {host: "tokens.local", want: authn.AuthConfig{IdentityToken: "tok"}},
		"bad base64":                      {host: "broken.local", wantErr: "not base64"},
		"no entry":                        {host: "elsewhere:5000", wantErr: `no auths entry for registry "elsewhere:5000"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseDockerConfig([]byte(cfg), tc.host)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("auth (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPushErrors(t *testing.T) {
	img, err := App(AppOptions{Binaries: []string{staticBinary(t, "x")}})
	if err != nil {
		t.Fatal(err)
	}
	reg := startRegistry(t, t.TempDir())
	authFile := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(authFile, []byte(`{"auths":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	tests := map[string]struct {
		ctx     context.Context
		ref     string
		opts    PushOptions
		wantErr string
	}{
		"bad ref":           {ctx: t.Context(), ref: "UPPER/case", wantErr: "ref"},
		"no auth entry":     {ctx: t.Context(), ref: reg.Addr() + "/x:1", opts: PushOptions{AuthFile: authFile}, wantErr: "no auths entry"},
		"missing auth file": {ctx: t.Context(), ref: reg.Addr() + "/x:1", opts: PushOptions{AuthFile: "/nonexistent.json"}, wantErr: "/nonexistent.json"},
		"canceled":          {ctx: ctx, ref: reg.Addr() + "/x:1", wantErr: "context canceled"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := Push(tc.ctx, img, tc.ref, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Push error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestRegistryBasicAuth: with WithBasicAuth, a push with the credentials
// (from a docker config.json) works, and a pull without them, or with
// others, is refused with a Basic challenge.
func TestRegistryBasicAuth(t *testing.T) {
	r, err := ServeRegistry("127.0.0.1:0", t.TempDir(), WithBasicAuth("puller", "right"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	img, err := App(AppOptions{Binaries: []string{staticBinary(t, "sidecar")}})
	if err != nil {
		t.Fatal(err)
	}
	ref := r.Addr() + "/private/app:1"
	if err := Push(t.Context(), img, ref, PushOptions{Insecure: true}); err == nil {
		t.Fatal("an anonymous push was let in")
	}
	authFile := filepath.Join(t.TempDir(), "config.json")
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, r.Addr(), base64.StdEncoding.EncodeToString([]byte("puller:right")))
	if err := os.WriteFile(authFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Push(t.Context(), img, ref, PushOptions{Insecure: true, AuthFile: authFile}); err != nil {
		t.Fatalf("push with the credentials: %v", err)
	}
	parsed, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	for what, a := range map[string]authn.Authenticator{
		"anonymous":      authn.Anonymous,
		"wrong password": &authn.Basic{Username: "puller", Password: "wrong"},
	} {
		if _, err := remote.Image(parsed, remote.WithAuth(a)); err == nil || !strings.Contains(err.Error(), "UNAUTHORIZED") {
			t.Errorf("%s pull: %v, want UNAUTHORIZED", what, err)
		}
	}
	got, err := remote.Image(parsed, remote.WithAuth(&authn.Basic{Username: "puller", Password: "right"}))
	if err != nil {
		t.Fatalf("pull with the credentials: %v", err)
	}
	if g, _ := got.Digest(); g != must(img.Digest()) {
		t.Errorf("pulled %s", g)
	}
	resp, err := http.Get("http://" + r.Addr() + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
		t.Errorf("GET /v2/ without credentials: %d, WWW-Authenticate %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
