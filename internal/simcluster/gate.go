package simcluster

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// APIGate is a plain-HTTP front door to the API server on loopback, for a
// process under test. It forwards every request with the cluster's
// credentials, and holds the ones a test picks: the test then knows that
// the process is exactly there, and can kill it. A held request whose
// client went away meanwhile is dropped, never forwarded, as if the
// process had died just before it.
type APIGate struct {
	// Kubeconfig is a file for the process: the gate, with no credentials.
	Kubeconfig string

	srv   *http.Server
	proxy *httputil.ReverseProxy
	mu    sync.Mutex
	holds []gateHold
	fails []gateFail
}

type gateFail struct {
	match func(Request) bool
	on    *atomic.Bool
	n     *atomic.Int64
}

type gateHold struct {
	match func(Request) bool
	hold  *Hold
}

// Request is what a hold's match sees of a request.
type Request struct {
	Method, Path string
	Body         []byte
}

// NewGate starts a gate in front of c's API server; Close stops it.
func (c *Cluster) NewGate() (*APIGate, error) {
	target, err := url.Parse(c.Config.Host)
	if err != nil {
		return nil, err
	}
	rt, err := rest.TransportFor(c.Config)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &APIGate{proxy: &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target); pr.Out.Host = target.Host },
		Transport:     rt,
		FlushInterval: -1, // watches stream
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil { // else the client is gone: nobody to tell
				http.Error(w, err.Error(), http.StatusBadGateway)
			}
		},
	}}
	dir, err := os.MkdirTemp(c.dir, "gate-")
	if err != nil {
		ln.Close()
		return nil, err
	}
	g.Kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: gate
  cluster:
    server: http://%s
contexts:
- name: gate
  context:
    cluster: gate
    user: gate
users:
- name: gate
  user: {}
current-context: gate
`, ln.Addr())
	if err := os.WriteFile(g.Kubeconfig, []byte(kc), 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	g.srv = &http.Server{Handler: http.HandlerFunc(g.serve), ReadHeaderTimeout: 10 * time.Second}
	go g.srv.Serve(ln)
	return g, nil
}

// HoldRequest holds the requests match picks until the hold is released.
func (g *APIGate) HoldRequest(match func(Request) bool) *Hold {
	h := newHold()
	g.mu.Lock()
	g.holds = append(g.holds, gateHold{match: match, hold: h})
	g.mu.Unlock()
	return h
}

// FailRequests answers the requests match picks with a 500 Internal
// Server Error, never forwarded, until stop is called; stop says how many
// it failed.
func (g *APIGate) FailRequests(match func(Request) bool) (stop func() int) {
	f := gateFail{match: match, on: &atomic.Bool{}, n: &atomic.Int64{}}
	f.on.Store(true)
	g.mu.Lock()
	g.fails = append(g.fails, f)
	g.mu.Unlock()
	return func() int {
		f.on.Store(false)
		g.mu.Lock()
		defer g.mu.Unlock()
		g.fails = slices.DeleteFunc(g.fails, func(o gateFail) bool { return o.on == f.on })
		return int(f.n.Load())
	}
}

// Close stops the gate and releases its holds.
func (g *APIGate) Close() error {
	g.mu.Lock()
	for _, h := range g.holds {
		h.hold.Release()
	}
	g.mu.Unlock()
	return g.srv.Close()
}

func (g *APIGate) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		req := Request{Method: r.Method, Path: r.URL.Path, Body: body}
		g.mu.Lock()
		var held []*Hold
		for _, h := range g.holds {
			if h.match(req) {
				held = append(held, h.hold)
			}
		}
		g.mu.Unlock()
		for _, h := range held {
			h.wait(r.Context())
		}
		if r.Context().Err() != nil {
			return // the client is gone: the request never happened
		}
		// A held request meets the failures armed when it goes on.
		g.mu.Lock()
		failed := false
		for _, f := range g.fails {
			if !failed && f.on.Load() && f.match(req) {
				f.n.Add(1)
				failed = true
			}
		}
		g.mu.Unlock()
		if failed {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"the simulated API gate fails %s %s","reason":"InternalError","code":500}`, r.Method, r.URL.Path)
			return
		}
	}
	g.proxy.ServeHTTP(w, r)
}
