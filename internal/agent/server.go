package agent

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/ms2m/ms2m/internal/ociimage"
)

// Config configures a Server.
type Config struct {
	// CheckpointDir is the kubelet's checkpoint folder. Archives are only
	// read from inside it.
	CheckpointDir string
	// LogDirs are the folders CRIU logs may be read from (the runtime's
	// state folder). Only files ending in .log are served.
	LogDirs []string
	// Token authenticates callers (Authorization: Bearer).
	Token string
	// Push configures pushes of checkpoint images.
	Push ociimage.PushOptions
	// Puller pulls images through the node's runtime.
	Puller Puller
	Logger *slog.Logger
}

// Puller pulls an image onto the node.
type Puller interface {
	Pull(ctx context.Context, ref string) error
}

// Server is the agent's HTTP API.
type Server struct {
	cfg Config
	log *slog.Logger
}

// NewServer checks cfg and returns a Server.
func NewServer(cfg Config) (*Server, error) {
	if cfg.CheckpointDir == "" {
		return nil, errors.New("agent: the checkpoint folder is not set (MS2M_AGENT_CHECKPOINT_DIR; the kubelet's is /var/lib/kubelet/checkpoints)")
	}
	if cfg.Token == "" {
		return nil, errors.New("agent: no token (MS2M_AGENT_TOKEN or MS2M_AGENT_TOKEN_FILE): the agent pushes images and reads node files, so it never runs unauthenticated")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, log: cfg.Logger}, nil
}

// BuildRequest asks for a checkpoint image.
type BuildRequest struct {
	Archive   string `json:"archive"`   // as the kubelet answered: a path in CheckpointDir
	Container string `json:"container"` // the checkpointed container's name
	Ref       string `json:"ref"`       // where to push it, a tag
}

// BuildResponse is the pushed image.
type BuildResponse struct {
	Image string        `json:"image"` // repo@sha256:...
	Size  int64         `json:"size"`  // the archive's size
	Took  time.Duration `json:"took"`
}

// PullRequest asks for an image on the node.
type PullRequest struct {
	Ref string `json:"ref"`
}

// Handler returns the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.Handle("POST /v1/checkpoint-images", s.auth(s.build))
	mux.Handle("DELETE /v1/checkpoint-images", s.auth(s.deleteImage))
	mux.Handle("POST /v1/pulls", s.auth(s.pull))
	mux.Handle("GET /v1/logs", s.auth(s.readLog))
	return mux
}

func (s *Server) auth(h http.HandlerFunc) http.Handler {
	want := []byte("Bearer " + s.cfg.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			httpError(w, http.StatusUnauthorized, errors.New("missing or wrong bearer token"))
			return
		}
		h(w, r)
	})
}

func (s *Server) build(w http.ResponseWriter, r *http.Request) {
	var req BuildRequest
	if err := decode(r, &req); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	archive, err := inside(s.cfg.CheckpointDir, req.Archive)
	if err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("archive: %w", err))
		return
	}
	tag, err := name.NewTag(req.Ref, name.WeakValidation)
	if err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("ref %q is not an image tag: %w", req.Ref, err))
		return
	}
	if req.Container == "" {
		httpError(w, http.StatusBadRequest, errors.New("container: empty; name the checkpointed container"))
		return
	}
	t0 := time.Now()
	st, err := os.Stat(archive)
	if err != nil {
		httpError(w, http.StatusNotFound, fmt.Errorf("archive %s: %w", req.Archive, err))
		return
	}
	img, err := ociimage.Checkpoint(archive, req.Container)
	if err != nil {
		httpError(w, http.StatusInternalServerError, err)
		return
	}
	if err := ociimage.Push(r.Context(), img, tag.String(), s.cfg.Push); err != nil {
		httpError(w, http.StatusBadGateway, fmt.Errorf("push %s: %w", tag, err))
		return
	}
	d, err := img.Digest()
	if err != nil {
		httpError(w, http.StatusInternalServerError, err)
		return
	}
	res := BuildResponse{Image: tag.Context().Digest(d.String()).String(), Size: st.Size(), Took: time.Since(t0)}
	s.log.Info("checkpoint image pushed", "archive", req.Archive, "image", res.Image, "bytes", res.Size, "took", res.Took)
	writeJSON(w, res)
}

// deleteImage deletes a checkpoint image this agent may have pushed
// (?ref=repo:tag or repo@digest): a failed migration leaves none behind.
func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("ref")
	if _, err := name.ParseReference(ref, name.WeakValidation); err != nil || ref == "" {
		httpError(w, http.StatusBadRequest, fmt.Errorf("ref %q is not an image reference (want ?ref=repo:tag or repo@sha256:...)", ref))
		return
	}
	if err := ociimage.Delete(r.Context(), ref, s.cfg.Push); err != nil {
		httpError(w, http.StatusBadGateway, err)
		return
	}
	s.log.Info("checkpoint image deleted", "image", ref)
	writeJSON(w, map[string]string{"deleted": ref})
}

func (s *Server) pull(w http.ResponseWriter, r *http.Request) {
	var req PullRequest
	if err := decode(r, &req); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	if _, err := name.ParseReference(req.Ref, name.WeakValidation); err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("ref %q: %w", req.Ref, err))
		return
	}
	if s.cfg.Puller == nil {
		httpError(w, http.StatusNotImplemented, errors.New("this agent has no container runtime to pull with (MS2M_AGENT_RUNTIME_ENDPOINT)"))
		return
	}
	t0 := time.Now()
	if err := s.cfg.Puller.Pull(r.Context(), req.Ref); err != nil {
		httpError(w, http.StatusBadGateway, err)
		return
	}
	s.log.Info("image pulled", "ref", req.Ref, "took", time.Since(t0))
	writeJSON(w, map[string]string{"ref": req.Ref})
}

func (s *Server) readLog(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	if !strings.HasSuffix(p, ".log") {
		httpError(w, http.StatusBadRequest, fmt.Errorf("path %q: only .log files are served", p))
		return
	}
	var full string
	var err error
	for _, dir := range s.cfg.LogDirs {
		if full, err = inside(dir, p); err == nil {
			break
		}
	}
	if full == "" {
		httpError(w, http.StatusForbidden, fmt.Errorf("path %q is outside the log folders %v", p, s.cfg.LogDirs))
		return
	}
	f, err := os.Open(full)
	if err != nil {
		httpError(w, http.StatusNotFound, err)
		return
	}
	defer f.Close()
	const tail = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > tail {
		f.Seek(st.Size()-tail, io.SeekStart)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.Copy(w, f)
}

// inside resolves p (absolute, or relative to dir) and checks that it lies
// in dir, after symlinks: the agent never reads outside its folders.
func inside(dir, p string) (string, error) {
	if p == "" {
		return "", errors.New("empty path")
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("folder %s: %w", dir, err)
	}
	realP, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(realDir, realP)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%s is outside %s", p, dir)
	}
	return realP, nil
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func httpError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

// Serve runs the API on ln until ctx is done.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	})
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
