package control

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Sidecar is what the control API drives.
type Sidecar interface {
	// State returns a JSON-encodable snapshot.
	State() any
	// Quiesce holds deliveries back and returns the checkpoint ID and the
	// log's epoch at it.
	Quiesce(ctx context.Context) (id, epoch uint64, err error)
	Resume(ctx context.Context) error
	// Stop returns a JSON-encodable result that carries the cutoff ID.
	Stop(ctx context.Context) (any, error)
	// Ready returns nil once the sidecar accepts app connections.
	Ready() error
}

// ErrConflict marks an operation that the sidecar's current mode does not
// allow; the API answers 409.
var ErrConflict = errors.New("not allowed in the sidecar's current mode")

// DefaultTimeout bounds quiesce and stop when the caller gives no
// ?timeout=.
const DefaultTimeout = 30 * time.Second

// Handler returns the control API. token is the bearer token; it must not
// be empty.
func Handler(s Sidecar, token string, gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	auth := func(h http.HandlerFunc) http.Handler { return requireToken(token, h) }
	mux.Handle("GET /state", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.State())
	}))
	mux.Handle("POST /quiesce", auth(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel, err := withTimeout(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		defer cancel()
		id, epoch, err := s.Quiesce(ctx)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]uint64{"checkpointId": id, "epoch": epoch})
	}))
	mux.Handle("POST /resume", auth(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel, err := withTimeout(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		defer cancel()
		if err := s.Resume(ctx); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"mode": "serving"})
	}))
	mux.Handle("POST /stop", auth(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel, err := withTimeout(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		defer cancel()
		res, err := s.Stop(ctx)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, res)
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	return mux
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

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}
