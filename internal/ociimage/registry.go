package ociimage

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// maxManifestBytes bounds a manifest PUT; real manifests are a few KiB.
const maxManifestBytes = 4 << 20

// Registry is an OCI distribution registry served in-process. Blobs and
// uploads in progress live on disk, so a 1 GB checkpoint layer costs disk,
// not memory. Manifests are kept in memory by go-containerregistry's
// registry and also written to disk, and a Registry started on the same
// directory serves them again.
//
// On disk under dir:
//
//	blobs/sha256/<hex>         verified blobs
//	uploads/<id>               uploads in progress (cleared at start)
//	manifests/<hash>.json      one per repository and tag or digest pushed
type Registry struct {
	ln   net.Listener
	srv  *http.Server
	done chan error
}

// RegistryOption tunes ServeRegistry.
type RegistryOption func(*registryConfig)

type registryConfig struct {
	log        *slog.Logger
	user, pass string
}

// WithRequestLog logs every request (method, path, status, bytes, time) to l.
func WithRequestLog(l *slog.Logger) RegistryOption {
	return func(c *registryConfig) { c.log = l }
}

// WithBasicAuth makes the registry answer only requests with this
// username and password (HTTP basic authentication); others get 401 with
// a Basic challenge, as a private registry does. For tests of pulls with
// credentials.
func WithBasicAuth(user, password string) RegistryOption {
	return func(c *registryConfig) { c.user, c.pass = user, password }
}

// ServeRegistry starts a registry on addr (host:port; port 0 picks a free
// one) that keeps its data under dir, creating dir if needed. It serves
// plain HTTP until Close.
func ServeRegistry(addr, dir string, opts ...RegistryOption) (*Registry, error) {
	cfg := registryConfig{log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg)
	}
	h, err := newRegistryHandler(dir, cfg.log)
	if err != nil {
		return nil, err
	}
	h.user, h.pass = cfg.user, cfg.pass
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("registry: listen on %s: %w", addr, err)
	}
	r := &Registry{
		ln:   ln,
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second},
		done: make(chan error, 1),
	}
	go func() { r.done <- r.srv.Serve(ln) }()
	return r, nil
}

// Addr is the address the registry listens on, as host:port.
func (r *Registry) Addr() string { return r.ln.Addr().String() }

// Close stops the registry. Requests in flight get five seconds to finish;
// then every connection is closed. Running out of those five seconds is not
// an error: a client's connection that never sent a request (Go's server
// counts those as active for five seconds) would otherwise fail Close.
func (r *Registry) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var err error
	if serr := r.srv.Shutdown(ctx); serr != nil {
		err = r.srv.Close()
	}
	if serr := <-r.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("registry on %s: close: %w", r.Addr(), err)
	}
	return nil
}

// regHandler serves blob uploads itself, straight to disk, and passes
// everything else to go-containerregistry's registry, whose blob reads come
// from the same disk store. Its own upload handling replaces the library's,
// which buffers each upload in memory.
type regHandler struct {
	store *diskStore
	inner http.Handler
	log   *slog.Logger
	// user and pass, when set, are the only credentials it serves.
	user, pass string

	mu      sync.Mutex
	uploads map[string]*upload
}

func newRegistryHandler(dir string, l *slog.Logger) (*regHandler, error) {
	store := &diskStore{dir: dir}
	for _, d := range []string{store.blobDir(), store.uploadDir(), store.manifestDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("registry: create %s: %w", d, err)
		}
	}
	// Uploads do not survive a restart: their state is in memory.
	if old, err := os.ReadDir(store.uploadDir()); err == nil {
		for _, e := range old {
			os.Remove(filepath.Join(store.uploadDir(), e.Name()))
		}
	}
	h := &regHandler{
		store:   store,
		inner:   registry.New(registry.WithBlobHandler(store), registry.Logger(log.New(io.Discard, "", 0))),
		log:     l,
		uploads: map[string]*upload{},
	}
	if err := h.replayManifests(); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *regHandler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	rec := &statusWriter{ResponseWriter: w}
	defer func() {
		h.log.Info("registry request", "method", req.Method, "path", req.URL.Path, "remote", req.RemoteAddr,
			"status", rec.status(), "bytes", rec.n, "duration", time.Since(start))
	}()
	if h.user != "" || h.pass != "" {
		u, p, ok := req.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(h.user)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(h.pass)) != 1 {
			rec.Header().Set("WWW-Authenticate", `Basic realm="ms2m test registry"`)
			http.Error(rec, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
	}
	if repo, id, ok := parseUploadPath(req.URL.Path); ok {
		h.serveUpload(rec, req, repo, id)
		return
	}
	if repo, ref, ok := parseManifestPath(req.URL.Path); ok && req.Method == http.MethodPut {
		h.putManifest(rec, req, repo, ref)
		return
	}
	h.inner.ServeHTTP(rec, req)
}

// parseUploadPath splits /v2/<repo>/blobs/uploads[/<id>].
func parseUploadPath(p string) (repo, id string, ok bool) {
	const seg = "/blobs/uploads"
	if !strings.HasPrefix(p, "/v2/") {
		return "", "", false
	}
	i := strings.LastIndex(p, seg)
	if i <= len("/v2") {
		return "", "", false
	}
	rest := p[i+len(seg):]
	if rest != "" && rest[0] != '/' {
		return "", "", false
	}
	id = strings.TrimPrefix(rest, "/")
	if strings.Contains(id, "/") {
		return "", "", false
	}
	return p[len("/v2/"):i], id, true
}

// parseManifestPath splits /v2/<repo>/manifests/<ref>.
func parseManifestPath(p string) (repo, ref string, ok bool) {
	const seg = "/manifests/"
	if !strings.HasPrefix(p, "/v2/") {
		return "", "", false
	}
	i := strings.LastIndex(p, seg)
	if i <= len("/v2") {
		return "", "", false
	}
	ref = p[i+len(seg):]
	if ref == "" || strings.Contains(ref, "/") {
		return "", "", false
	}
	return p[len("/v2/"):i], ref, true
}

type upload struct {
	mu   sync.Mutex
	f    *os.File
	h    hash.Hash
	size int64
}

func (h *regHandler) serveUpload(w http.ResponseWriter, req *http.Request, repo, id string) {
	switch {
	case req.Method == http.MethodPost && id == "":
		h.startUpload(w, req, repo)
	case req.Method == http.MethodPatch && id != "":
		h.patchUpload(w, req, repo, id)
	case req.Method == http.MethodPut && id != "":
		h.finishUpload(w, req, repo, id)
	case req.Method == http.MethodGet && id != "":
		u := h.getUpload(id)
		if u == nil {
			writeRegError(w, http.StatusNotFound, "BLOB_UPLOAD_UNKNOWN", "no upload "+id)
			return
		}
		u.mu.Lock()
		size := u.size
		u.mu.Unlock()
		uploadHeaders(w, repo, id, size)
		w.WriteHeader(http.StatusNoContent)
	case req.Method == http.MethodDelete && id != "":
		u := h.takeUpload(id)
		if u == nil {
			writeRegError(w, http.StatusNotFound, "BLOB_UPLOAD_UNKNOWN", "no upload "+id)
			return
		}
		u.discard()
		w.WriteHeader(http.StatusNoContent)
	default:
		writeRegError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", req.Method+" "+req.URL.Path)
	}
}

func (h *regHandler) startUpload(w http.ResponseWriter, req *http.Request, repo string) {
	q := req.URL.Query()
	if m := q.Get("mount"); m != "" {
		if d, err := v1.NewHash(m); err == nil {
			if _, err := h.store.Stat(req.Context(), repo, d); err == nil {
				blobCreated(w, repo, d)
				return
			}
		}
		// Not here: fall back to a normal upload, as the spec says.
	}
	if dg := q.Get("digest"); dg != "" {
		want, err := parseSHA256(dg)
		if err != nil {
			writeRegError(w, http.StatusBadRequest, "DIGEST_INVALID", err.Error())
			return
		}
		if err := h.store.putVerified(want, req.Body); err != nil {
			writeStoreError(w, err)
			return
		}
		blobCreated(w, repo, want)
		return
	}
	id, err := newUploadID()
	if err != nil {
		writeRegError(w, http.StatusInternalServerError, "UNKNOWN", err.Error())
		return
	}
	f, err := os.Create(filepath.Join(h.store.uploadDir(), id))
	if err != nil {
		writeRegError(w, http.StatusInternalServerError, "UNKNOWN", err.Error())
		return
	}
	h.mu.Lock()
	h.uploads[id] = &upload{f: f, h: sha256.New()}
	h.mu.Unlock()
	uploadHeaders(w, repo, id, 0)
	w.WriteHeader(http.StatusAccepted)
}

func (h *regHandler) patchUpload(w http.ResponseWriter, req *http.Request, repo, id string) {
	u := h.getUpload(id)
	if u == nil {
		writeRegError(w, http.StatusNotFound, "BLOB_UPLOAD_UNKNOWN", "no upload "+id)
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if cr := req.Header.Get("Content-Range"); cr != "" {
		start, err := parseContentRangeStart(cr)
		if err != nil || start != u.size {
			uploadHeaders(w, repo, id, u.size)
			writeRegError(w, http.StatusRequestedRangeNotSatisfiable, "BLOB_UPLOAD_INVALID",
				fmt.Sprintf("Content-Range %q does not continue at byte %d", cr, u.size))
			return
		}
	}
	if err := u.append(req.Body); err != nil {
		writeRegError(w, http.StatusInternalServerError, "BLOB_UPLOAD_INVALID", err.Error())
		return
	}
	uploadHeaders(w, repo, id, u.size)
	w.WriteHeader(http.StatusAccepted)
}

func (h *regHandler) finishUpload(w http.ResponseWriter, req *http.Request, repo, id string) {
	want, err := parseSHA256(req.URL.Query().Get("digest"))
	if err != nil {
		writeRegError(w, http.StatusBadRequest, "DIGEST_INVALID", err.Error())
		return
	}
	u := h.takeUpload(id)
	if u == nil {
		writeRegError(w, http.StatusNotFound, "BLOB_UPLOAD_UNKNOWN", "no upload "+id)
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := u.append(req.Body); err != nil {
		u.discard()
		writeRegError(w, http.StatusInternalServerError, "BLOB_UPLOAD_INVALID", err.Error())
		return
	}
	got := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(u.h.Sum(nil))}
	if got != want {
		u.discard()
		writeRegError(w, http.StatusBadRequest, "DIGEST_INVALID",
			fmt.Sprintf("upload has digest %s, not %s", got, want))
		return
	}
	name := u.f.Name()
	if err := u.f.Close(); err != nil {
		os.Remove(name)
		writeRegError(w, http.StatusInternalServerError, "UNKNOWN", err.Error())
		return
	}
	if err := h.store.commit(name, want); err != nil {
		writeRegError(w, http.StatusInternalServerError, "UNKNOWN", err.Error())
		return
	}
	blobCreated(w, repo, want)
}

func (h *regHandler) getUpload(id string) *upload {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.uploads[id]
}

func (h *regHandler) takeUpload(id string) *upload {
	h.mu.Lock()
	defer h.mu.Unlock()
	u := h.uploads[id]
	delete(h.uploads, id)
	return u
}

func (u *upload) append(r io.Reader) error {
	n, err := io.Copy(io.MultiWriter(u.f, u.h), r)
	u.size += n
	if err != nil {
		return fmt.Errorf("write upload after %d bytes: %w", u.size, err)
	}
	return nil
}

func (u *upload) discard() {
	u.f.Close()
	os.Remove(u.f.Name())
}

// manifestRecord is a pushed manifest as kept on disk.
type manifestRecord struct {
	Repo        string `json:"repo"`
	Ref         string `json:"ref"`
	ContentType string `json:"contentType"`
	Manifest    []byte `json:"manifest"`
}

// putManifest hands a manifest to the inner registry and, once it took it,
// writes it to disk.
func (h *regHandler) putManifest(w http.ResponseWriter, req *http.Request, repo, ref string) {
	body, err := io.ReadAll(io.LimitReader(req.Body, maxManifestBytes+1))
	if err != nil {
		writeRegError(w, http.StatusBadRequest, "MANIFEST_INVALID", err.Error())
		return
	}
	if len(body) > maxManifestBytes {
		writeRegError(w, http.StatusRequestEntityTooLarge, "SIZE_INVALID",
			fmt.Sprintf("manifest is over %d bytes", maxManifestBytes))
		return
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	rec := &statusWriter{ResponseWriter: w}
	h.inner.ServeHTTP(rec, req)
	if rec.status() != http.StatusCreated {
		return
	}
	rcd := manifestRecord{Repo: repo, Ref: ref, ContentType: req.Header.Get("Content-Type"), Manifest: body}
	if err := h.store.saveManifest(rcd); err != nil {
		// The push succeeded; only a restart would lose this manifest.
		h.log.Error("registry: keep manifest on disk", "repo", repo, "ref", ref, "err", err)
	}
}

// replayManifests loads the manifests on disk into the inner registry:
// images first, since an index may only name manifests already present.
func (h *regHandler) replayManifests() error {
	recs, err := h.store.loadManifests()
	if err != nil {
		return err
	}
	sort.SliceStable(recs, func(i, j int) bool {
		return !types.MediaType(recs[i].ContentType).IsIndex() && types.MediaType(recs[j].ContentType).IsIndex()
	})
	for _, r := range recs {
		req, err := http.NewRequest(http.MethodPut, "/v2/"+r.Repo+"/manifests/"+r.Ref, bytes.NewReader(r.Manifest))
		if err != nil {
			return fmt.Errorf("registry: reload manifest %s:%s: %w", r.Repo, r.Ref, err)
		}
		req.Header.Set("Content-Type", r.ContentType)
		rec := &statusWriter{ResponseWriter: discardResponse{}}
		h.inner.ServeHTTP(rec, req)
		if rec.status() != http.StatusCreated {
			return fmt.Errorf("registry: reload manifest %s:%s: status %d; remove %s to start empty",
				r.Repo, r.Ref, rec.status(), h.store.manifestDir())
		}
	}
	return nil
}

// diskStore keeps blobs and manifests under dir. It is the inner
// registry's BlobHandler.
type diskStore struct {
	dir string
}

var (
	_ registry.BlobHandler       = (*diskStore)(nil)
	_ registry.BlobStatHandler   = (*diskStore)(nil)
	_ registry.BlobPutHandler    = (*diskStore)(nil)
	_ registry.BlobDeleteHandler = (*diskStore)(nil)
)

func (s *diskStore) blobDir() string     { return filepath.Join(s.dir, "blobs", "sha256") }
func (s *diskStore) uploadDir() string   { return filepath.Join(s.dir, "uploads") }
func (s *diskStore) manifestDir() string { return filepath.Join(s.dir, "manifests") }

func (s *diskStore) blobPath(h v1.Hash) (string, error) {
	if h.Algorithm != "sha256" || len(h.Hex) != 64 {
		return "", fmt.Errorf("%w: unsupported digest %s", registry.ErrNotFound, h)
	}
	return filepath.Join(s.blobDir(), h.Hex), nil
}

// Stat trusts the file: blobs are only renamed into place once verified.
func (s *diskStore) Stat(_ context.Context, _ string, h v1.Hash) (int64, error) {
	p, err := s.blobPath(h)
	if err != nil {
		return 0, err
	}
	st, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return 0, registry.ErrNotFound
	}
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func (s *diskStore) Get(_ context.Context, _ string, h v1.Hash) (io.ReadCloser, error) {
	p, err := s.blobPath(h)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, registry.ErrNotFound
	}
	return f, err
}

func (s *diskStore) Put(_ context.Context, _ string, h v1.Hash, rc io.ReadCloser) error {
	defer rc.Close()
	return s.putVerified(h, rc)
}

func (s *diskStore) Delete(_ context.Context, _ string, h v1.Hash) error {
	p, err := s.blobPath(h)
	if err != nil {
		return err
	}
	if err := os.Remove(p); errors.Is(err, os.ErrNotExist) {
		return registry.ErrNotFound
	} else if err != nil {
		return err
	}
	return nil
}

// errDigestMismatch marks content that does not hash to its digest.
var errDigestMismatch = errors.New("digest mismatch")

// putVerified streams r to a temporary file and moves it into place only
// if it hashes to want.
func (s *diskStore) putVerified(want v1.Hash, r io.Reader) error {
	if _, err := s.blobPath(want); err != nil {
		return err
	}
	f, err := os.CreateTemp(s.uploadDir(), "put-*")
	if err != nil {
		return err
	}
	hh := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, hh), r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	if got := hex.EncodeToString(hh.Sum(nil)); got != want.Hex {
		os.Remove(f.Name())
		return fmt.Errorf("%w: content has sha256:%s, not %s", errDigestMismatch, got, want)
	}
	return s.commit(f.Name(), want)
}

// commit moves a verified file into the blob store.
func (s *diskStore) commit(tmp string, h v1.Hash) error {
	p, err := s.blobPath(h)
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("store blob %s: %w", h, err)
	}
	return nil
}

func (s *diskStore) saveManifest(r manifestRecord) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	key := sha256.Sum256([]byte(r.Repo + "\x00" + r.Ref))
	path := filepath.Join(s.manifestDir(), hex.EncodeToString(key[:])+".json")
	return writeFileAtomic(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

func (s *diskStore) loadManifests() ([]manifestRecord, error) {
	entries, err := os.ReadDir(s.manifestDir())
	if err != nil {
		return nil, fmt.Errorf("registry: read manifests: %w", err)
	}
	var out []manifestRecord
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(s.manifestDir(), e.Name())
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("registry: read manifest: %w", err)
		}
		var r manifestRecord
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("registry: manifest record %s: %w; remove it to go on", p, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func parseSHA256(s string) (v1.Hash, error) {
	if s == "" {
		return v1.Hash{}, errors.New("digest parameter missing")
	}
	h, err := v1.NewHash(s)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("digest %q: %w", s, err)
	}
	if h.Algorithm != "sha256" {
		return v1.Hash{}, fmt.Errorf("digest %q: only sha256 is supported", s)
	}
	return h, nil
}

// parseContentRangeStart reads the start of "<start>-<end>", with or
// without a "bytes " or "bytes=" prefix.
func parseContentRangeStart(cr string) (int64, error) {
	cr = strings.TrimPrefix(strings.TrimPrefix(cr, "bytes="), "bytes ")
	start, _, ok := strings.Cut(cr, "-")
	if !ok {
		return 0, fmt.Errorf("Content-Range %q is not start-end", cr)
	}
	return strconv.ParseInt(start, 10, 64)
}

func newUploadID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func uploadHeaders(w http.ResponseWriter, repo, id string, size int64) {
	end := size - 1
	if end < 0 {
		end = 0
	}
	w.Header().Set("Location", "/v2/"+repo+"/blobs/uploads/"+id)
	w.Header().Set("Range", fmt.Sprintf("0-%d", end))
	w.Header().Set("Docker-Upload-UUID", id)
	w.Header().Set("Content-Length", "0")
}

func blobCreated(w http.ResponseWriter, repo string, h v1.Hash) {
	w.Header().Set("Location", "/v2/"+repo+"/blobs/"+h.String())
	w.Header().Set("Docker-Content-Digest", h.String())
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusCreated)
}

func writeStoreError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, errDigestMismatch):
		writeRegError(w, http.StatusBadRequest, "DIGEST_INVALID", err.Error())
	case errors.Is(err, registry.ErrNotFound):
		writeRegError(w, http.StatusBadRequest, "DIGEST_INVALID", err.Error())
	default:
		writeRegError(w, http.StatusInternalServerError, "UNKNOWN", err.Error())
	}
}

// writeRegError writes an error body as the distribution spec describes.
func writeRegError(w http.ResponseWriter, status int, code, msg string) {
	body, _ := json.Marshal(map[string]any{"errors": []map[string]string{{"code": code, "message": msg}}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body) // the status is sent; a client gone by now has nothing to read
}

// statusWriter remembers the status and counts the body bytes.
type statusWriter struct {
	http.ResponseWriter
	code int
	n    int64
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	s.n += int64(n)
	return n, err
}

// ReadFrom keeps the sendfile path of the underlying writer for blob GETs.
func (s *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	var n int64
	var err error
	if rf, ok := s.ResponseWriter.(io.ReaderFrom); ok {
		n, err = rf.ReadFrom(r)
	} else {
		n, err = io.Copy(struct{ io.Writer }{s.ResponseWriter}, r)
	}
	s.n += n
	return n, err
}

func (s *statusWriter) status() int {
	if s.code == 0 {
		return http.StatusOK
	}
	return s.code
}

// discardResponse is the ResponseWriter of a replayed request.
type discardResponse struct{}

func (discardResponse) Header() http.Header         { return http.Header{} }
func (discardResponse) Write(b []byte) (int, error) { return len(b), nil }
func (discardResponse) WriteHeader(int)             {}
