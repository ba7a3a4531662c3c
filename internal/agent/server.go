package agent

import (
	"archive/tar"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/ociimage"
)

// Config configures a Server.
type Config struct {
	// CheckpointDir is the kubelet's checkpoint folder. Archives are only
	// read from inside it.
	CheckpointDir string
	// LogDirs are the folders CRIU logs may be read from (the runtime's
	// state folder). Only regular files whose real path (symlinks
	// resolved) lies in one of them and ends in .log are served.
	LogDirs []string
	// Repository is where checkpoint images go (registry/path, for
	// example registry.example.com/ms2m/checkpoints): the agent pushes and
	// deletes images in it or under it, and refuses any other reference.
	// Empty: it refuses every push and delete.
	Repository string
	// KeepArchives leaves the kubelet's checkpoint archive on the node
	// once its image is pushed (for debugging). Default: the archive, the
	// process's whole memory, is removed as soon as the image is in the
	// registry.
	KeepArchives bool
	// ArchiveGrace is how long the archive of a checkpoint the agent asked
	// for may stay without an image built from it (the migration ended
	// first, the build failed, or the agent died): then SweepArchives
	// removes it. Zero: DefaultArchiveGrace.
	ArchiveGrace time.Duration
	// Token authenticates callers (Authorization: Bearer). A checkpoint
	// takes a token derived from it instead (CheckpointToken).
	Token string
	// NodeName is the agent's node: checkpoint tokens are for it.
	NodeName string
	// Kubelet is the node's kubelet, which takes checkpoints (POST
	// /v1/checkpoints); nil answers 501.
	Kubelet *Kubelet
	// Push configures pushes of checkpoint images.
	Push ociimage.PushOptions
	// Puller pulls images through the node's runtime.
	Puller Puller
	// Freeze finds containers' cgroups and tasks (GET /v1/freeze).
	// Default: /sys/fs/cgroup and /proc.
	Freeze FreezeWatch
	// Locator finds a checkpointed container to resume it if a failed
	// checkpoint left it paused (see unpause.go); nil, or a Freeze
	// without a Runtime: the agent cannot.
	Locator Locator
	// Node reports what the node's runtime can do (GET /v1/node); nil
	// answers 501.
	Node   NodeProber
	Logger *slog.Logger
}

// Puller pulls an image onto the node.
type Puller interface {
	Pull(ctx context.Context, ref string, auth *contract.RegistryAuth) error
}

// NodeProber reports the node's capabilities (NodeProbe).
type NodeProber interface {
	Probe(ctx context.Context) contract.NodeCapabilities
}

// Server is the agent's HTTP API.
type Server struct {
	cfg  Config
	repo *name.Repository // nil: Config.Repository is empty
	log  *slog.Logger
	jan  *janitor
}

// NewServer checks cfg and returns a Server.
func NewServer(cfg Config) (*Server, error) {
	if cfg.CheckpointDir == "" {
		return nil, errors.New("agent: the checkpoint folder is not set (MS2M_AGENT_CHECKPOINT_DIR; the kubelet's is /var/lib/kubelet/checkpoints)")
	}
	if cfg.Token == "" {
		return nil, errors.New("agent: no token (MS2M_AGENT_TOKEN or MS2M_AGENT_TOKEN_FILE): the agent pushes images and reads node files, so it never runs unauthenticated")
	}
	if cfg.Kubelet != nil && cfg.NodeName == "" {
		return nil, errors.New("agent: the node's name is not set (NODE_NAME): checkpoint tokens are for one node")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, jan: newJanitor(cfg)}
	if cfg.Repository != "" {
		repo, err := name.NewRepository(strings.TrimSuffix(cfg.Repository, "/"), name.WeakValidation)
		if err != nil {
			return nil, fmt.Errorf("agent: the checkpoint repository %q (MS2M_AGENT_IMAGE_REPO) is not a repository: %w", cfg.Repository, err)
		}
		s.repo = &repo
	}
	return s, nil
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
	// Auth are the credentials for Ref's registry from the pod's
	// imagePullSecrets, which the migrator read; nil: the node's own. The
	// agent passes them to the runtime for this pull only, and never
	// keeps or logs them.
	Auth *contract.RegistryAuth `json:"auth,omitempty"`
}

// Handler returns the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.Handle("POST /v1/checkpoints", http.HandlerFunc(s.checkpoint)) // its own token: see checkpoint
	mux.Handle("POST /v1/checkpoint-images", s.auth(s.build))
	mux.Handle("DELETE /v1/checkpoint-images", s.auth(s.deleteImage))
	mux.Handle("POST /v1/pulls", s.auth(s.pull))
	mux.Handle("GET /v1/logs", s.auth(s.readLog))
	mux.Handle("GET /v1/freeze", s.auth(s.waitFreeze))
	mux.Handle("GET /v1/node", s.auth(s.nodeInfo))
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
	t0 := time.Now()
	f, archive, err := openInside([]string{s.cfg.CheckpointDir}, req.Archive, nil)
	if err != nil {
		httpError(w, fileErrorStatus(err), fmt.Errorf("archive %s: %w", req.Archive, err))
		return
	}
	defer f.Close()
	defer s.jan.building(archive)()
	tag, err := name.NewTag(req.Ref, name.WeakValidation)
	if err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("ref %q is not an image tag: %w", req.Ref, err))
		return
	}
	if req.Container == "" {
		httpError(w, http.StatusBadRequest, errors.New("container: empty; name the checkpointed container"))
		return
	}
	if err := s.inRepository(tag); err != nil {
		httpError(w, http.StatusForbidden, fmt.Errorf("push to %s refused: %w", req.Ref, err))
		return
	}
	st, err := f.Stat()
	if err != nil {
		httpError(w, http.StatusInternalServerError, fmt.Errorf("archive %s: %w", req.Archive, err))
		return
	}
	if err := s.inNamespaceRepository(tag, f, st.Size(), archive, req.Container); err != nil {
		httpError(w, http.StatusForbidden, fmt.Errorf("push to %s refused: %w", req.Ref, err))
		return
	}
	// From here on a failed build removes the archive: no migration
	// builds from one checkpoint twice, and it holds the process's memory.
	ok := false
	defer func() {
		if !ok {
			s.dropArchive(f, archive)
		}
	}()
	// The image reads the archive through the open file (its /proc link
	// reopens the same inode): a symlink swapped in after the check cannot
	// make it read another file.
	img, err := ociimage.Checkpoint(fdPath(f), req.Container)
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
	ok = true
	if !s.cfg.KeepArchives {
		s.removeArchive(f, archive)
	}
	s.jan.built(archive)
	writeJSON(w, res)
}

// dropArchive removes an archive whose build failed: no migration builds
// from a checkpoint twice, and it holds the process's memory.
func (s *Server) dropArchive(f *os.File, archive string) {
	if !s.cfg.KeepArchives {
		s.removeArchive(f, archive)
	}
	s.jan.built(archive)
}

// deleteImage deletes a checkpoint image this agent may have pushed
// (?ref=repo:tag or repo@digest): a failed migration leaves none behind.
func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("ref")
	parsed, err := name.ParseReference(ref, name.WeakValidation)
	if err != nil || ref == "" {
		httpError(w, http.StatusBadRequest, fmt.Errorf("ref %q is not an image reference (want ?ref=repo:tag or repo@sha256:...)", ref))
		return
	}
	if err := s.inRepository(parsed); err != nil {
		httpError(w, http.StatusForbidden, fmt.Errorf("delete of %s refused: %w", ref, err))
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
	if err := s.cfg.Puller.Pull(r.Context(), req.Ref, req.Auth); err != nil {
		httpError(w, http.StatusBadGateway, err)
		return
	}
	s.log.Info("image pulled", "ref", req.Ref, "withPullSecret", req.Auth != nil, "took", time.Since(t0))
	writeJSON(w, map[string]string{"ref": req.Ref})
}

func (s *Server) readLog(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	if !strings.HasSuffix(p, ".log") {
		httpError(w, http.StatusBadRequest, fmt.Errorf("path %q: only .log files are served", p))
		return
	}
	// The suffix is checked again on the real path: a link named x.log
	// may point at any file of the folder.
	f, _, err := openInside(s.cfg.LogDirs, p, func(real string) error {
		if !strings.HasSuffix(real, ".log") {
			return fmt.Errorf("%w: it resolves to %s, and only .log files are served", errOutside, filepath.Base(real))
		}
		return nil
	})
	if errors.Is(err, errOutside) {
		httpError(w, http.StatusForbidden, fmt.Errorf("path %q is outside the log folders %v: %w", p, s.cfg.LogDirs, err))
		return
	}
	if err != nil {
		httpError(w, fileErrorStatus(err), fmt.Errorf("path %q: %w", p, err))
		return
	}
	defer f.Close()
	const tail = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > tail {
		if _, err := f.Seek(st.Size()-tail, io.SeekStart); err != nil {
			httpError(w, http.StatusInternalServerError, fmt.Errorf("seek to the last %d bytes of %s: %w", tail, p, err))
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if _, err := io.Copy(w, f); err != nil {
		s.log.Warn("sending a log's tail failed", "path", p, "err", err)
	}
}

// FreezeWatching is the first line of a GET /v1/freeze answer: the watch
// is in place.
type FreezeWatching struct {
	Watching string `json:"watching"` // the cgroup folder polled
}

// waitFreeze watches the container (?pod=<pod UID>&container=<container
// ID>) until it is in ?state=frozen, thawed or dumped, for at most
// ?timeout= (a Go duration, at most 2 minutes); with state=dumped,
// ?thaw=true also thaws the container once CRIU let it go
// (FreezeWatch.WaitDump). It answers 404 at once if the container has no
// cgroup on this node; else 200 and two JSON lines: a FreezeWatching as
// soon as the watch is in place (so that a caller can start what freezes
// the container only then), and, once seen, a FreezeResult, or
// {"error": ...} if the state was not seen in time.
func (s *Server) waitFreeze(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	timeout, err := time.ParseDuration(q.Get("timeout"))
	if err != nil || timeout <= 0 || timeout > 2*time.Minute {
		httpError(w, http.StatusBadRequest, fmt.Errorf("timeout %q: want a Go duration up to 2m", q.Get("timeout")))
		return
	}
	state := q.Get("state")
	if state != Frozen && state != Thawed && state != Dumped {
		httpError(w, http.StatusBadRequest, fmt.Errorf("state %q: want %s, %s or %s", state, Frozen, Thawed, Dumped))
		return
	}
	thawIt := false
	switch q.Get("thaw") {
	case "", "false":
	case "true":
		thawIt = true
	default:
		httpError(w, http.StatusBadRequest, fmt.Errorf("thaw %q: want true or false", q.Get("thaw")))
		return
	}
	if thawIt && state != Dumped {
		httpError(w, http.StatusBadRequest, fmt.Errorf("thaw=true goes with state=%s only", Dumped))
		return
	}
	dir, err := s.cfg.Freeze.FindCgroup(q.Get("pod"), q.Get("container"))
	if errors.Is(err, fs.ErrNotExist) {
		httpError(w, http.StatusNotFound, err)
		return
	}
	if err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	if err := enc.Encode(FreezeWatching{Watching: dir}); err != nil {
		return // the caller went away before the watch: nothing to wait for
	}
	if err := http.NewResponseController(w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return // as above
	}
	var res FreezeResult
	if state == Dumped {
		res, err = s.cfg.Freeze.WaitDump(r.Context(), dir, q.Get("container"), thawIt, timeout)
		if res.ThawedByUs {
			s.log.Info("thawed a container after CRIU's dump", "cgroup", dir, "seized", res.Seized, "dumped", res.At)
		}
	} else {
		res, err = s.cfg.Freeze.Wait(r.Context(), dir, state, timeout)
	}
	if err != nil {
		_ = enc.Encode(map[string]string{"error": err.Error()}) // see httpError
		return
	}
	_ = enc.Encode(res) // see httpError
}

// errOutside marks a path the agent refuses to open.
var errOutside = errors.New("outside the agent's folders")

// openInside opens p (absolute, or relative to each of dirs in turn) for
// reading if its real path, every symlink resolved, lies in one of dirs
// (their own real paths), names a regular file and passes check (nil: no
// more checks). The file opened is checked to be the one resolved, so
// that a link swapped in after the check is caught. It returns the file
// and its real path.
func openInside(dirs []string, p string, check func(real string) error) (*os.File, string, error) {
	if p == "" {
		return nil, "", errors.New("empty path")
	}
	var firstErr error
	for _, dir := range dirs {
		f, real, err := openIn(dir, p, check)
		if err == nil {
			return f, real, nil
		}
		if firstErr == nil || (errors.Is(firstErr, errOutside) && !errors.Is(err, errOutside)) {
			firstErr = err
		}
	}
	if firstErr == nil {
		firstErr = fmt.Errorf("%w: no folder is configured", errOutside)
	}
	return nil, "", firstErr
}

func openIn(dir, p string, check func(real string) error) (*os.File, string, error) {
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, "", fmt.Errorf("folder %s: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return nil, "", err
	}
	if !within(realDir, real) {
		return nil, "", fmt.Errorf("%w: %s resolves to a file outside %s", errOutside, p, dir)
	}
	if check != nil {
		if err := check(real); err != nil {
			return nil, "", err
		}
	}
	f, err := os.OpenFile(real, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, "", err
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%w: %s is not a regular file", errOutside, p)
	}
	if err == nil {
		// A folder on the way swapped for a link between the two steps
		// would open another file: what the kernel opened must be real.
		if got, lerr := os.Readlink(fdPath(f)); lerr == nil && got != real {
			err = fmt.Errorf("%w: %s changed while it was opened", errOutside, p)
		}
	}
	if err != nil {
		f.Close()
		return nil, "", err
	}
	return f, real, nil
}

// within says whether path p lies in dir (both clean and absolute).
func within(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// fdPath is the /proc path of f's descriptor: opening it opens the same
// file, whatever happens to its name.
func fdPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

// fileErrorStatus is the HTTP status of an openInside error.
func fileErrorStatus(err error) int {
	switch {
	case errors.Is(err, errOutside):
		return http.StatusForbidden
	case errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound
	}
	return http.StatusBadRequest
}

// inRepository checks that ref names an image in the configured
// repository or under it: the agent's push credentials reach more than
// ms2m's images, and its caller must not borrow them.
func (s *Server) inRepository(ref name.Reference) error {
	if s.repo == nil {
		return errors.New("this agent has no checkpoint repository configured (MS2M_AGENT_IMAGE_REPO), so it pushes and deletes nothing")
	}
	got := ref.Context()
	if got.RegistryStr() == s.repo.RegistryStr() &&
		(got.RepositoryStr() == s.repo.RepositoryStr() || strings.HasPrefix(got.RepositoryStr(), s.repo.RepositoryStr()+"/")) {
		return nil
	}
	return fmt.Errorf("%s is outside the checkpoint repository %s, the only one this agent pushes to and deletes from (MS2M_AGENT_IMAGE_REPO)", got, s.repo)
}

// inNamespaceRepository checks that ref is in the repository of the
// namespace whose pod archive is a checkpoint of: <repository>/<namespace>.
// Each namespace's memory goes to its own repository, where pulls can be
// granted to it alone, and a caller cannot file one namespace's checkpoint
// under another's.
//
// The namespace is what the runtime wrote into the archive
// (ArchiveOrigin), not what its name says: the kubelet names an archive
// checkpoint-<pod>_<namespace>-<container>-<time>.tar, and a namespace and
// a container name both may hold hyphens, so namespace a with container
// b-c and namespace a-b with container c give the same name. The name must
// still agree with the archive's origin, and the container asked for must
// be the one checkpointed.
func (s *Server) inNamespaceRepository(ref name.Reference, f *os.File, size int64, archive, container string) error {
	o, err := ArchiveOrigin(io.NewSectionReader(f, 0, size))
	if err != nil {
		return fmt.Errorf("archive %s: %w", filepath.Base(archive), err)
	}
	if o.Container != container {
		return fmt.Errorf("archive %s is a checkpoint of container %s of pod %s/%s, not of container %s", filepath.Base(archive), o.Container, o.Namespace, o.Pod, container)
	}
	if want := "checkpoint-" + o.Pod + "_" + o.Namespace + "-" + o.Container + "-"; !strings.HasPrefix(filepath.Base(archive), want) {
		return fmt.Errorf("archive %s holds a checkpoint of %s/%s container %s, but is not named as the kubelet names one (%s<time>.tar)", filepath.Base(archive), o.Namespace, o.Pod, o.Container, want)
	}
	want := s.repo.RepositoryStr() + "/" + o.Namespace
	if got := ref.Context().RepositoryStr(); got != want {
		return fmt.Errorf("the archive is of a pod in namespace %s, whose checkpoints go to %s/%s only, not %s", o.Namespace, s.repo.RegistryStr(), want, got)
	}
	return nil
}

// Origin is the pod and container a checkpoint archive was taken of, as
// the container runtime recorded it in the archive.
type Origin struct{ Namespace, Pod, Container string }

// The kubelet's labels on every container it creates, which the runtime
// keeps: containerd writes them into the archive's status.dump (the CRI
// container status), CRI-O as annotations of its spec.dump.
const (
	labelPodNamespace = "io.kubernetes.pod.namespace"
	labelPodName      = "io.kubernetes.pod.name"
	labelContainer    = "io.kubernetes.container.name"
)

// ArchiveOrigin reads an archive's origin from its status.dump (labels)
// or spec.dump (annotations), whichever it has; if both say, they must
// agree. The tar's other members are skipped (seeked over), not read.
func ArchiveOrigin(r io.ReadSeeker) (Origin, error) {
	const maxMeta = 4 << 20
	var found []Origin
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Origin{}, fmt.Errorf("not a checkpoint archive (a tar): %w", err)
		}
		var field string
		switch path.Clean(strings.TrimPrefix(h.Name, "./")) {
		case "status.dump":
			field = "labels"
		case "spec.dump":
			field = "annotations"
		default:
			continue
		}
		if h.Size > maxMeta {
			return Origin{}, fmt.Errorf("%s is %d bytes, more than a runtime writes", h.Name, h.Size)
		}
		var meta map[string]json.RawMessage
		if err := json.NewDecoder(io.LimitReader(tr, maxMeta)).Decode(&meta); err != nil {
			return Origin{}, fmt.Errorf("%s: %w", h.Name, err)
		}
		var kv map[string]string
		if raw, ok := meta[field]; ok {
			if err := json.Unmarshal(raw, &kv); err != nil {
				return Origin{}, fmt.Errorf("%s, %s: %w", h.Name, field, err)
			}
		}
		o := Origin{Namespace: kv[labelPodNamespace], Pod: kv[labelPodName], Container: kv[labelContainer]}
		if o != (Origin{}) {
			found = append(found, o)
		}
	}
	if len(found) == 0 {
		return Origin{}, errors.New("it records no pod and container (status.dump's labels, spec.dump's annotations " + labelPodNamespace + ", " + labelPodName + ", " + labelContainer + "), so its namespace is unknown")
	}
	o := found[0]
	for _, other := range found[1:] {
		if other != o {
			return Origin{}, fmt.Errorf("its status.dump and spec.dump disagree on its pod (%+v, %+v)", o, other)
		}
	}
	if len(validation.IsDNS1123Label(o.Namespace)) > 0 || len(validation.IsDNS1123Subdomain(o.Pod)) > 0 || o.Container == "" {
		return Origin{}, fmt.Errorf("it records pod %q in namespace %q, container %q: not names the API server gives", o.Pod, o.Namespace, o.Container)
	}
	return o, nil
}

// removeArchive deletes the archive once its image is pushed: it holds the
// process's memory, and nothing reads it again. Only the file that was
// read goes: a file put in its place is left.
func (s *Server) removeArchive(f *os.File, archive string) {
	opened, err1 := f.Stat()
	now, err2 := os.Lstat(archive)
	if err1 != nil || err2 != nil || !os.SameFile(opened, now) {
		s.log.Warn("checkpoint archive not removed: it changed since it was read", "archive", archive)
		return
	}
	if err := os.Remove(archive); err != nil {
		s.log.Warn("could not remove the checkpoint archive; delete it by hand, it holds the process's memory (the agent needs the checkpoint folder mounted read-write)", "archive", archive, "err", err)
		return
	}
	s.log.Info("checkpoint archive removed", "archive", archive)
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}

// writeJSON and httpError answer a request. A reply that cannot be written
// means the client went away: there is no one left to tell.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func httpError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

// Serve runs the API on ln until ctx is done.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close() // the grace is over: drop the connections still open
		}
	})
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
