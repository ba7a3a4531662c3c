package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Endpoint is a sidecar's control API.
type Endpoint struct {
	URL   string // http://host:port
	Token string
}

// HandoverOptions tune Handover.
type HandoverOptions struct {
	// MaxLag: the source is stopped once the target's app is at most MaxLag
	// deliveries behind the source's (the source's last delivery ID minus
	// the last replayed one the target's app acked).
	MaxLag uint64
	// Deadline, if set, stops the source when it passes even if the lag is
	// higher: the ms2m-cutoff strategy's T_cutoff.
	Deadline time.Time
	// StopAt, if set, also stops the source once it returns true for the
	// lag: the adaptive cutoff, which weighs the live backlog.
	StopAt func(lag uint64) bool
	// SwitchTimeout bounds the wait for the target to replay to the cutoff
	// and switch. Default 5 minutes.
	SwitchTimeout time.Duration
	// Poll is the interval between state reads. Default 10 ms.
	Poll time.Duration
	// HTTP is the client. Default a client with a 10 s timeout.
	HTTP *http.Client
}

// Timings are what a handover measured, from the sidecars' clocks.
type Timings struct {
	// CutoffID is the last delivery the source handed to its app.
	CutoffID uint64 `json:"cutoffId"`
	// StopStarted is when the source stopped accepting primary deliveries;
	// Stopped when its cutoff marker was durable.
	StopStarted time.Time `json:"stopStarted"`
	Stopped     time.Time `json:"stopped"`
	// LastReplayed is when the target handed the app its last replayed
	// delivery (zero if there was nothing to replay after the stop).
	LastReplayed time.Time `json:"lastReplayed,omitzero"`
	// Switched is when the broker confirmed the target's consume on the
	// primary queue; FirstPrimary is its first primary delivery, if one came
	// while Handover waited.
	Switched     time.Time `json:"switched"`
	FirstPrimary time.Time `json:"firstPrimary,omitzero"`
	// Downtime is Switched - StopStarted: no instance accepted primary
	// deliveries in between.
	Downtime time.Duration `json:"downtime"`
	// LagAtStop is how many of the source's deliveries the target's app had
	// not acked when the source was stopped.
	LagAtStop uint64 `json:"lagAtStop"`
	// Held counts deliveries the source held back since its quiesce and
	// gave its app on stop, before the cutoff; Requeued those it gave back
	// to the broker instead (MS2M_STOP_HELD=requeue), which the target gets.
	Held     int `json:"held"`
	Requeued int `json:"requeued"`
}

// sourceState is the part of a source's GET /state that Handover reads.
type sourceState struct {
	Log struct {
		LastID uint64 `json:"lastId"`
	} `json:"log"`
}

// targetState is the part of a target's GET /state that Handover reads.
type targetState struct {
	Mode      string  `json:"mode"`
	Ready     bool    `json:"ready"`
	ReplayLag *uint64 `json:"replayLag"`
	Queues    []struct {
		LastAckedID uint64 `json:"lastAckedId"`
	} `json:"queues"`
	Replay *struct {
		Replaying      int        `json:"replaying"`
		LastReplayedAt *time.Time `json:"lastReplayedAt"`
		SwitchedAt     *time.Time `json:"switchedAt"`
		FirstPrimaryAt *time.Time `json:"firstPrimaryAt"`
		Error          string     `json:"error"`
		Interrupted    int        `json:"interrupted"`
	} `json:"replay"`
	Source *Status `json:"source"`
}

// Handover stops the source and lets the target take over: it waits until
// the target's replay lag is at most MaxLag (or Deadline passes), stops the
// source at a cutoff, and waits until the target has replayed up to it and
// consumes the primary queue. If it fails after the stop, the source stays
// stopped: the caller decides whether to resume it (POST /resume).
func Handover(ctx context.Context, source, target Endpoint, o HandoverOptions) (Timings, error) {
	if o.SwitchTimeout <= 0 {
		o.SwitchTimeout = 5 * time.Minute
	}
	if o.Poll <= 0 {
		o.Poll = 10 * time.Millisecond
	}
	if o.HTTP == nil {
		o.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	var t Timings

	// 1. Let the target catch up: lag is the source's last delivery ID
	// minus the last replayed one the target's app has acked.
	for {
		st, err := getState(ctx, o.HTTP, target)
		if err != nil {
			return t, fmt.Errorf("handover: read the target's state: %w", err)
		}
		if st.Source == nil || st.ReplayLag == nil {
			return t, fmt.Errorf("handover: the target at %s is not in replay mode (start it with MS2M_REPLAY_START)", target.URL)
		}
		if st.Source.Error != "" {
			return t, fmt.Errorf("handover: the target cannot replay: %s", st.Source.Error)
		}
		if err := st.interrupted(); err != nil {
			return t, fmt.Errorf("handover: %w", err)
		}
		var src sourceState
		if err := call(ctx, o.HTTP, source, http.MethodGet, "/state", &src); err != nil {
			return t, fmt.Errorf("handover: read the source's state: %w", err)
		}
		lag := st.lagBehind(src.Log.LastID)
		if st.Ready && lag <= o.MaxLag {
			t.LagAtStop = lag
			break
		}
		if st.Ready && o.StopAt != nil && o.StopAt(lag) {
			t.LagAtStop = lag
			break
		}
		if !o.Deadline.IsZero() && time.Now().After(o.Deadline) {
			t.LagAtStop = lag
			break
		}
		if err := sleep(ctx, o.Poll); err != nil {
			return t, fmt.Errorf("handover: wait for the target to catch up (lag %d, want <= %d): %w", lag, o.MaxLag, err)
		}
	}

	// 2. Stop the source at a cutoff.
	var stop struct {
		StartedAt time.Time `json:"startedAt"`
		CutoffID  uint64    `json:"cutoffId"`
		StoppedAt time.Time `json:"stoppedAt"`
		Held      int       `json:"held"`
		Requeued  int       `json:"requeued"`
	}
	if err := call(ctx, o.HTTP, source, http.MethodPost, "/stop?timeout=60s", &stop); err != nil {
		return t, fmt.Errorf("handover: stop the source: %w; it keeps serving or stays as the stop left it (POST /resume undoes a stop)", err)
	}
	t.CutoffID, t.StopStarted, t.Stopped, t.Held, t.Requeued = stop.CutoffID, stop.StartedAt, stop.StoppedAt, stop.Held, stop.Requeued

	// 3. Wait for the target to replay to the cutoff and switch.
	ctx, cancel := context.WithTimeout(ctx, o.SwitchTimeout)
	defer cancel()
	for {
		st, err := getState(ctx, o.HTTP, target)
		if err != nil {
			return t, fmt.Errorf("handover: the source is stopped at cutoff %d, but reading the target failed: %w", t.CutoffID, err)
		}
		if st.Source != nil && st.Source.Error != "" {
			return t, fmt.Errorf("handover: the source is stopped at cutoff %d, but the target cannot replay: %s", t.CutoffID, st.Source.Error)
		}
		if st.Replay != nil && st.Replay.Error != "" {
			return t, fmt.Errorf("handover: the source is stopped at cutoff %d, but the target's replay failed: %s", t.CutoffID, st.Replay.Error)
		}
		if err := st.interrupted(); err != nil {
			return t, fmt.Errorf("handover: the source is stopped at cutoff %d, but %w", t.CutoffID, err)
		}
		if r := st.Replay; r != nil && st.Source != nil && st.Source.Complete && r.SwitchedAt != nil && r.Replaying == 0 {
			t.Switched = *r.SwitchedAt
			if r.LastReplayedAt != nil && r.LastReplayedAt.After(t.StopStarted) {
				t.LastReplayed = *r.LastReplayedAt
			}
			if r.FirstPrimaryAt != nil {
				t.FirstPrimary = *r.FirstPrimaryAt
			}
			t.Downtime = t.Switched.Sub(t.StopStarted)
			return t, nil
		}
		if err := sleep(ctx, o.Poll); err != nil {
			return t, fmt.Errorf("handover: the source is stopped at cutoff %d, but the target did not switch to the primary queue in %s: %w", t.CutoffID, o.SwitchTimeout, err)
		}
	}
}

// Quiesce asks a sidecar to hold new deliveries and waits (up to timeout)
// until the app has settled what it has: a consistent cut to checkpoint
// at. It returns the cut: the checkpoint ID, the last delivery the app was
// given, and the log's epoch then.
func Quiesce(ctx context.Context, hc *http.Client, e Endpoint, timeout time.Duration) (Cut, error) {
	var out Cut
	if err := call(ctx, hc, e, http.MethodPost, "/quiesce?timeout="+timeout.String(), &out); err != nil {
		return Cut{}, fmt.Errorf("quiesce the sidecar at %s: %w", e.URL, err)
	}
	return out, nil
}

// Cut is where a quiesced sidecar stands: a replay of a checkpoint taken
// now covers the IDs after ID, and waits for a cutoff marker of an epoch
// after Epoch.
type Cut struct {
	ID    uint64 `json:"checkpointId"`
	Epoch uint64 `json:"epoch"`
}

// Resume undoes a quiesce or a stop: the sidecar serves again.
func Resume(ctx context.Context, hc *http.Client, e Endpoint) error {
	var out map[string]any
	if err := call(ctx, hc, e, http.MethodPost, "/resume", &out); err != nil {
		return fmt.Errorf("resume the sidecar at %s: %w", e.URL, err)
	}
	return nil
}

// Rates returns a sidecar's live λ (deliveries per second, summed over its
// queues) and μ (the app's processing rate, summed likewise).
func Rates(ctx context.Context, hc *http.Client, e Endpoint) (lambda, mu float64, err error) {
	var st struct {
		Queues []struct {
			Lambda float64 `json:"lambda"`
			Mu     float64 `json:"mu"`
		} `json:"queues"`
	}
	if err := call(ctx, hc, e, http.MethodGet, "/state", &st); err != nil {
		return 0, 0, fmt.Errorf("read the rates of the sidecar at %s: %w", e.URL, err)
	}
	for _, q := range st.Queues {
		lambda += q.Lambda
		mu += q.Mu
	}
	return lambda, mu, nil
}

// StopResult is what a sidecar's POST /stop answers.
type StopResult struct {
	StartedAt time.Time `json:"startedAt"`
	CutoffID  uint64    `json:"cutoffId"`
	Epoch     uint64    `json:"epoch"`
	Held      int       `json:"held"`
	Requeued  int       `json:"requeued"`
	StoppedAt time.Time `json:"stoppedAt"`
}

// Stop ends a sidecar's tenure at a cutoff: it cancels the app's consumers
// upstream, gives the app what it held back since a quiesce, waits until
// the app settled all it has and writes the cutoff marker.
func Stop(ctx context.Context, hc *http.Client, e Endpoint, timeout time.Duration) (StopResult, error) {
	var out StopResult
	if err := call(ctx, hc, e, http.MethodPost, "/stop?timeout="+timeout.String(), &out); err != nil {
		return out, fmt.Errorf("stop the sidecar at %s: %w", e.URL, err)
	}
	return out, nil
}

// WaitSwitched waits until a target sidecar consumes the primary queue
// (its replay is done), and returns when the broker confirmed the switch.
func WaitSwitched(ctx context.Context, hc *http.Client, target Endpoint, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		st, err := getState(ctx, hc, target)
		if err == nil {
			if st.Source != nil && st.Source.Error != "" {
				return time.Time{}, fmt.Errorf("the target cannot replay: %s", st.Source.Error)
			}
			if r := st.Replay; r != nil {
				if r.Error != "" {
					return time.Time{}, fmt.Errorf("the target's replay failed: %s", r.Error)
				}
				if err := st.interrupted(); err != nil {
					return time.Time{}, err
				}
				if r.SwitchedAt != nil && r.Replaying == 0 {
					return *r.SwitchedAt, nil
				}
			}
		}
		if serr := sleep(ctx, 20*time.Millisecond); serr != nil {
			return time.Time{}, fmt.Errorf("the target at %s did not switch to the primary queue in %s (last error: %v): %w", target.URL, timeout, err, serr)
		}
	}
}

// interrupted is an error if the target's app went away in the middle of
// its replay after settling replayed deliveries: a restarted app was
// restored from the checkpoint again and lacks them, and the target cannot
// tell a restart from a reconnect, so such a target is given up.
func (st targetState) interrupted() error {
	if st.Replay == nil || st.Replay.Interrupted == 0 {
		return nil
	}
	return fmt.Errorf("the target's app lost its connection in the middle of the replay (%d times), after it had processed replayed messages; if it was restarted, it was restored from the checkpoint again and lacks them, so the target cannot be trusted to be exact", st.Replay.Interrupted)
}

// lagBehind is how many of the source's deliveries up to last the target's
// app has not acked yet.
func (st targetState) lagBehind(last uint64) uint64 {
	var acked uint64
	for _, q := range st.Queues {
		acked = max(acked, q.LastAckedID)
	}
	if last <= acked {
		return 0
	}
	return last - acked
}

func getState(ctx context.Context, hc *http.Client, e Endpoint) (targetState, error) {
	var st targetState
	err := call(ctx, hc, e, http.MethodGet, "/state", &st)
	return st, err
}

func call(ctx context.Context, hc *http.Client, e Endpoint, method, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(e.URL, "/")+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+e.Token)
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
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	return json.Unmarshal(b, v)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(d):
		return nil
	}
}

// Switched reports whether a target sidecar has taken over: its replay is
// done and it consumes the primary queue.
func Switched(ctx context.Context, hc *http.Client, target Endpoint) (bool, error) {
	st, err := getState(ctx, hc, target)
	if err != nil {
		return false, fmt.Errorf("read the state of the sidecar at %s: %w", target.URL, err)
	}
	return st.Replay != nil && st.Replay.SwitchedAt != nil && st.Replay.Replaying == 0, nil
}

// SidecarState is what a migrator checks of a sidecar before it starts.
type SidecarState struct {
	Mode  string // serving, quiesced or stopped
	Ready bool   // its replay log is open
	// Replaying: it is a migration's target that has not taken over yet.
	Replaying bool
}

// Inspect reads a sidecar's state.
func Inspect(ctx context.Context, hc *http.Client, e Endpoint) (SidecarState, error) {
	st, err := getState(ctx, hc, e)
	if err != nil {
		return SidecarState{}, fmt.Errorf("read the state of the sidecar at %s: %w", e.URL, err)
	}
	out := SidecarState{Mode: st.Mode, Ready: st.Ready}
	if r := st.Replay; r != nil && (r.SwitchedAt == nil || r.Replaying > 0) {
		out.Replaying = true
	}
	return out, nil
}
