package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ms2m/ms2m/internal/proxy"
)

// Client is the migrator's end of one sidecar's control API.
type Client struct {
	URL   string // http://host:port
	Token string
	// HTTP is the client. Default: one with a 10 s timeout.
	HTTP *http.Client
}

// ClientAt is the client of the control API at host:port.
func ClientAt(host string, port int, token string, hc *http.Client) Client {
	return Client{URL: "http://" + net.JoinHostPort(host, strconv.Itoa(port)), Token: token, HTTP: hc}
}

// StatusError is an answer other than 200 OK. It matches ErrConflict
// (errors.Is) when the status is 409.
type StatusError struct {
	Method, Path string
	Code         int
	Status       string // as the response's status line has it
	Message      string // the answer's error, or its body
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.Method, e.Path, e.Status, e.Message)
}

// Is makes a 409 match ErrConflict.
func (e *StatusError) Is(target error) bool {
	return target == ErrConflict && e.Code == http.StatusConflict
}

// transient reports whether a failed call may succeed if made again: no
// answer at all (the sidecar restarts, the network drops), or a server-side
// failure. An answer that refuses the request (401, 409...) stays the same.
func transient(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code >= 500 || se.Code == http.StatusRequestTimeout || se.Code == http.StatusTooManyRequests
	}
	return err != nil && !errors.Is(err, context.Canceled)
}

// State reads the sidecar's GET /state.
func (c Client) State(ctx context.Context) (State, error) {
	var st State
	err := c.call(ctx, http.MethodGet, "/state", &st)
	return st, err
}

// Quiesce asks a sidecar to hold new deliveries and waits (up to timeout)
// until the app has settled what it has: a consistent cut to checkpoint
// at. It returns the cut: the checkpoint ID, the log's epoch then, and the
// hold that ResumeHold checks.
func (c Client) Quiesce(ctx context.Context, timeout time.Duration) (Cut, error) {
	var out Cut
	if err := c.callWaiting(ctx, http.MethodPost, "/quiesce?timeout="+timeout.String(), timeout, &out); err != nil {
		return Cut{}, fmt.Errorf("quiesce the sidecar at %s: %w", c.URL, err)
	}
	return out, nil
}

// Resume undoes a quiesce or a stop: the sidecar serves again. On a
// serving sidecar it is no error.
func (c Client) Resume(ctx context.Context) error {
	var out ResumeResult
	if err := c.call(ctx, http.MethodPost, "/resume", &out); err != nil {
		return fmt.Errorf("resume the sidecar at %s: %w", c.URL, err)
	}
	return nil
}

// ResumeHold resumes a sidecar that is still quiesced under hold, the
// Cut.Hold of its quiesce. If it is not (it restarted, or was resumed,
// stopped or quiesced again since), the sidecar is left as it is and the
// error matches ErrConflict: a checkpoint taken under hold may hold
// deliveries after its checkpoint ID. An empty hold (a sidecar that
// predates holds) resumes as Resume does.
func (c Client) ResumeHold(ctx context.Context, hold string) error {
	if hold == "" {
		return c.Resume(ctx)
	}
	var out ResumeResult
	if err := c.call(ctx, http.MethodPost, "/resume?hold="+url.QueryEscape(hold), &out); err != nil {
		return fmt.Errorf("resume the sidecar at %s under hold %s: %w", c.URL, hold, err)
	}
	return nil
}

// Stop ends a sidecar's tenure at a cutoff: it cancels the app's consumers
// upstream, gives the app what it held back since a quiesce, waits until
// the app settled all it has and writes the cutoff marker.
func (c Client) Stop(ctx context.Context, timeout time.Duration) (StopResult, error) {
	var out StopResult
	if err := c.callWaiting(ctx, http.MethodPost, "/stop?timeout="+timeout.String(), timeout, &out); err != nil {
		return out, fmt.Errorf("stop the sidecar at %s: %w", c.URL, err)
	}
	return out, nil
}

// Rates returns a sidecar's live λ (deliveries per second, summed over its
// queues) and μ (the app's processing rate, summed likewise).
func (c Client) Rates(ctx context.Context) (lambda, mu float64, err error) {
	st, err := c.State(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("read the rates of the sidecar at %s: %w", c.URL, err)
	}
	for _, q := range st.Queues {
		lambda += q.Lambda
		mu += q.Mu
	}
	return lambda, mu, nil
}

// Switched reports whether a target sidecar has taken over: its replay is
// done and it consumes the primary queue.
func (c Client) Switched(ctx context.Context) (bool, error) {
	st, err := c.State(ctx)
	if err != nil {
		return false, fmt.Errorf("read the state of the sidecar at %s: %w", c.URL, err)
	}
	return st.switched(), nil
}

// SidecarState is what a migrator checks of a sidecar before it starts.
type SidecarState struct {
	Mode  string // serving, quiesced or stopped
	Ready bool   // its replay log is open
	// Replaying: it is a migration's target that has not taken over yet.
	Replaying bool
	// Unreplayable lists the queues the app consumes that a migration
	// cannot carry over (exclusive, auto-delete, server-named).
	Unreplayable []proxy.UnreplayableQueue
}

// Inspect reads a sidecar's state.
func (c Client) Inspect(ctx context.Context) (SidecarState, error) {
	st, err := c.State(ctx)
	if err != nil {
		return SidecarState{}, fmt.Errorf("read the state of the sidecar at %s: %w", c.URL, err)
	}
	out := SidecarState{Mode: st.Mode, Ready: st.Ready, Unreplayable: st.Unreplayable}
	if r := st.Replay; r != nil && (r.SwitchedAt == nil || r.Replaying > 0) {
		out.Replaying = true
	}
	return out, nil
}

// switched: the target's replay is done and it consumes the primary queue.
func (st State) switched() bool {
	return st.TookOver != nil || st.Replay != nil && st.Replay.SwitchedAt != nil && st.Replay.Replaying == 0
}

// switchedAt is when a switched target's broker confirmed its switch.
func (st State) switchedAt() time.Time {
	if st.TookOver != nil {
		return st.TookOver.SwitchedAt
	}
	return *st.Replay.SwitchedAt
}

func (c Client) call(ctx context.Context, method, path string, v any) error {
	return c.callWaiting(ctx, method, path, 0, v)
}

// answerMargin is what a request that the sidecar may hold for up to its
// own timeout is given beyond it: the time to answer.
const answerMargin = 5 * time.Second

// callWaiting is call for a request that the sidecar may hold for up to
// wait (a quiesce or stop waiting for the app's acks): the client's own
// timeout is raised to wait and a margin, so that it does not give up
// first. Before, the default 10 s client cut a 30 s quiesce short.
func (c Client) callWaiting(ctx context.Context, method, path string, wait time.Duration, v any) error {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.URL, "/")+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	if hc.Timeout > 0 && hc.Timeout < wait+answerMargin {
		longer := *hc
		longer.Timeout = wait + answerMargin
		hc = &longer
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		se := &StatusError{Method: method, Path: path, Code: resp.StatusCode, Status: resp.Status, Message: strings.TrimSpace(string(b))}
		var e ErrorResponse
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			se.Message = e.Error
		}
		return se
	}
	return json.Unmarshal(b, v)
}

// sleep waits d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(d):
		return nil
	}
}
