package control

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Sidecar is what the control API drives.
type Sidecar interface {
	// State returns a snapshot (its Hold is the server's to fill in).
	State() State
	// Quiesce holds deliveries back until the app has settled what it has,
	// and returns the cut (its Hold is the server's to fill in).
	Quiesce(ctx context.Context) (Cut, error)
	// Resume undoes a quiesce or a stop; on a serving sidecar it is a no-op.
	Resume(ctx context.Context) error
	// Stop ends the sidecar's tenure at a cutoff.
	Stop(ctx context.Context) (StopResult, error)
	// Ready returns nil once the sidecar accepts app connections.
	Ready() error
}

// ErrConflict marks an operation that the sidecar's current mode does not
// allow; the API answers 409.
var ErrConflict = errors.New("not allowed in the sidecar's current mode")

// DefaultTimeout bounds quiesce, resume and stop when the caller gives no
// ?timeout=.
const DefaultTimeout = 30 * time.Second

// server serves the control API of one Sidecar and keeps the hold of the
// quiesce in force. The hold lives as long as the server: a restarted
// sidecar has none, so a resume with the hold of its earlier life fails.
type server struct {
	s Sidecar
	// ops serialises quiesce, resume and stop, so that a hold is checked
	// and used, or made, with no other operation in between; a channel so
	// that a caller's timeout also bounds its wait for it.
	ops chan struct{}

	mu   sync.Mutex
	hold string // the quiesce in force, "" if none
}

// Handler returns the control API. token is the bearer token; it must not
// be empty.
func Handler(s Sidecar, token string, gatherer prometheus.Gatherer) http.Handler {
	srv := &server{s: s, ops: make(chan struct{}, 1)}
	mux := http.NewServeMux()
	auth := func(h http.HandlerFunc) http.Handler { return requireToken(token, h) }
	mux.Handle("GET /state", auth(func(w http.ResponseWriter, r *http.Request) {
		st := s.State()
		st.Hold = srv.currentHold()
		writeJSON(w, http.StatusOK, st)
	}))
	mux.Handle("POST /quiesce", auth(srv.op(func(ctx context.Context, r *http.Request) (any, error) {
		srv.setHold("") // whatever comes of it, an earlier hold is void
		cut, err := s.Quiesce(ctx)
		if err != nil {
			return nil, err
		}
		cut.Hold = newHold()
		srv.setHold(cut.Hold)
		return cut, nil
	})))
	mux.Handle("POST /resume", auth(srv.op(func(ctx context.Context, r *http.Request) (any, error) {
		if want := r.URL.Query().Get("hold"); want != "" {
			if err := checkHold(want, srv.currentHold(), s.State().Mode); err != nil {
				return nil, err
			}
		}
		if err := s.Resume(ctx); err != nil {
			return nil, err
		}
		srv.setHold("")
		return ResumeResult{Mode: ModeServing}, nil
	})))
	mux.Handle("POST /stop", auth(srv.op(func(ctx context.Context, r *http.Request) (any, error) {
		srv.setHold("") // a stop ends a quiesce, and a failed one may have too
		return s.Stop(ctx)
	})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n")) // see writeJSON
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n")) // see writeJSON
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	return mux
}

// op runs f, one operation at a time, under the request's ?timeout=, and
// writes its answer.
func (srv *server) op(f func(context.Context, *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel, err := withTimeout(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		defer cancel()
		select {
		case srv.ops <- struct{}{}:
		case <-ctx.Done():
			writeError(w, statusOf(ctx.Err()), fmt.Errorf("wait for the sidecar's operation under way: %w", ctx.Err()))
			return
		}
		defer func() { <-srv.ops }()
		v, err := f(ctx, r)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

func (srv *server) currentHold() string {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.hold
}

func (srv *server) setHold(h string) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	srv.hold = h
}

// newHold returns a fresh hold ID.
func newHold() string {
	var b [12]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// checkHold is nil if a resume with hold want may go on: the sidecar is
// quiesced (mode) under that very hold (current). Otherwise it is an
// ErrConflict that says why, so that the migrator discards a checkpoint
// taken under want.
func checkHold(want, current, mode string) error {
	const discard = "a checkpoint taken under it may hold deliveries after its checkpoint ID: discard it"
	switch {
	case current == "":
		return fmt.Errorf("%w: the sidecar is %s and holds no quiesce, not hold %s: it was restarted, resumed or stopped since that quiesce, so %s", ErrConflict, mode, want, discard)
	case current != want:
		return fmt.Errorf("%w: the sidecar is quiesced under hold %s, not %s: it was quiesced again since, so %s", ErrConflict, current, want, discard)
	case mode != ModeQuiesced:
		return fmt.Errorf("%w: the sidecar is %s, not quiesced under hold %s, so %s", ErrConflict, mode, want, discard)
	}
	return nil
}

func requireToken(token string, h http.HandlerFunc) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if token == "" || subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ms2m-sidecar"`)
			writeError(w, http.StatusUnauthorized, errors.New("missing or wrong bearer token: send 'Authorization: Bearer <token>' with the sidecar's control token"))
			return
		}
		h(w, r)
	})
}

func withTimeout(r *http.Request) (context.Context, context.CancelFunc, error) {
	d := DefaultTimeout
	if v := r.URL.Query().Get("timeout"); v != "" {
		var err error
		d, err = time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, nil, errors.New("query parameter timeout: want a positive Go duration such as 30s or 500ms, got " + v)
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), d)
	return ctx, cancel, nil
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	case errors.Is(err, ErrConflict):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// writeJSON answers a request. A reply that cannot be written means the
// client went away: there is no one left to tell.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, ErrorResponse{Error: err.Error()})
}
