package control

import (
	"context"
	"errors"
	"fmt"
	"time"
)

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
	// CatchUpTimeout bounds the wait for the target to catch up before the
	// stop (when no Deadline ends it first): past it, Handover fails with
	// ErrBeforeStop and the source keeps serving. Default: SwitchTimeout.
	CatchUpTimeout time.Duration
	// Poll is the interval between state reads. Default 10 ms.
	Poll time.Duration
	// ReadRetry bounds how long, once the source is stopped, reads of the
	// target that fail for a transient cause (no answer, a 5xx) are
	// retried, with back-off, before Handover gives up: from then on the
	// target may have taken over, and a caller that gives up on it cannot
	// simply roll back. Default DefaultReadRetry.
	ReadRetry time.Duration
}

// DefaultReadRetry is HandoverOptions.ReadRetry's default.
const DefaultReadRetry = 20 * time.Second

// ErrBeforeStop marks a Handover error from before it asked the source to
// stop: the source serves, no cutoff was written, so the target cannot
// have taken over.
var ErrBeforeStop = errors.New("the handover failed before it stopped the source")

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
	// Recovered counts the NATS push deliveries the server made to no one
	// during the stop, which the source logged before the cutoff for the
	// target (its own app never had them).
	Recovered int `json:"recovered,omitempty"`
}

// Handover stops the source and lets the target take over: it waits until
// the target's replay lag is at most MaxLag (or Deadline passes), stops the
// source at a cutoff, and waits until the target has replayed up to it and
// consumes the primary queue. An error before the stop matches
// ErrBeforeStop. If it fails after the stop, the source stays stopped and
// the target may have taken over: the caller finds out (Switched) before it
// resumes the source or deletes the target.
func Handover(ctx context.Context, source, target Client, o HandoverOptions) (Timings, error) {
	o = o.withDefaults()
	var t Timings
	lag, err := catchUp(ctx, source, target, o)
	if err != nil {
		return t, err
	}
	t.LagAtStop = lag

	// Stop the source at a cutoff.
	stop, err := source.Stop(ctx, 60*time.Second)
	if err != nil {
		return t, fmt.Errorf("handover: %w; it keeps serving or stays as the stop left it (POST /resume undoes a stop)", err)
	}
	t.CutoffID, t.StopStarted, t.Stopped, t.Held, t.Requeued, t.Recovered = stop.CutoffID, stop.StartedAt, stop.StoppedAt, stop.Held, stop.Requeued, stop.Recovered
	return waitSwitch(ctx, target, o, t)
}

// withDefaults fills in the options left zero.
func (o HandoverOptions) withDefaults() HandoverOptions {
	if o.SwitchTimeout <= 0 {
		o.SwitchTimeout = 5 * time.Minute
	}
	if o.Poll <= 0 {
		o.Poll = 10 * time.Millisecond
	}
	if o.ReadRetry <= 0 {
		o.ReadRetry = DefaultReadRetry
	}
	if o.CatchUpTimeout <= 0 {
		o.CatchUpTimeout = o.SwitchTimeout
	}
	return o
}

// catchUp waits until the target may take over: its replay lag (the
// source's last delivery ID minus the last one the target's app has the
// effects of: the last replayed one it acked, or the checkpoint ID if it
// acked none) is at most MaxLag, StopAt says so, or Deadline passed. It
// returns the lag then. Every error matches ErrBeforeStop.
func catchUp(ctx context.Context, source, target Client, o HandoverOptions) (uint64, error) {
	by := time.Now().Add(o.CatchUpTimeout)
	for {
		st, err := target.State(ctx)
		if err != nil {
			return 0, fmt.Errorf("handover: read the target's state: %w: %w", err, ErrBeforeStop)
		}
		if err := st.replayable(); err != nil {
			return 0, fmt.Errorf("handover: %w (target %s): %w", err, target.URL, ErrBeforeStop)
		}
		src, err := source.State(ctx)
		if err != nil {
			return 0, fmt.Errorf("handover: read the source's state: %w: %w", err, ErrBeforeStop)
		}
		lag := st.lagBehind(src.Log.LastID)
		switch {
		case st.Ready && lag <= o.MaxLag,
			st.Ready && o.StopAt != nil && o.StopAt(lag),
			!o.Deadline.IsZero() && time.Now().After(o.Deadline):
			return lag, nil
		case o.Deadline.IsZero() && time.Now().After(by):
			return 0, fmt.Errorf("handover: the target did not catch up in %s (lag %d deliveries, want <= %d; ready %t): it replays slower than the source consumes, or its app does not ack; the source keeps serving: %w", o.CatchUpTimeout, lag, o.MaxLag, st.Ready, ErrBeforeStop)
		}
		if err := sleep(ctx, o.Poll); err != nil {
			return 0, fmt.Errorf("handover: wait for the target to catch up (lag %d, want <= %d): %w: %w", lag, o.MaxLag, err, ErrBeforeStop)
		}
	}
}

// replayable is an error if a target before the stop cannot take over:
// it is not in replay mode, cannot read its log, or its app's replay was
// interrupted.
func (st State) replayable() error {
	if st.Source == nil || st.ReplayLag == nil {
		return errors.New("the target is not in replay mode (start it with MS2M_REPLAY_START)")
	}
	if st.Source.Error != "" {
		return fmt.Errorf("the target cannot replay: %s", st.Source.Error)
	}
	return st.interrupted()
}

// waitSwitch waits, once the source is stopped at t.CutoffID, until the
// target has replayed up to it and consumes the primary queue, and fills
// in t's switch timings. Failed reads are retried: the target may be
// taking over.
func waitSwitch(ctx context.Context, target Client, o HandoverOptions, t Timings) (Timings, error) {
	ctx, cancel := context.WithTimeout(ctx, o.SwitchTimeout)
	defer cancel()
	for {
		st, err := target.stateRetry(ctx, o.Poll, o.ReadRetry)
		if err != nil {
			return t, fmt.Errorf("handover: the source is stopped at cutoff %d, but reading the target failed: %w", t.CutoffID, err)
		}
		if err := st.replayFailed(); err != nil {
			return t, fmt.Errorf("handover: the source is stopped at cutoff %d, but %w", t.CutoffID, err)
		}
		if st.TookOver != nil { // its sidecar restarted since: no replay to time
			t.Switched = st.TookOver.SwitchedAt
			t.Downtime = t.Switched.Sub(t.StopStarted)
			return t, nil
		}
		if r := st.Replay; st.Source != nil && st.Source.Complete && st.switched() {
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

// replayFailed is an error if a target's replay cannot go on: it cannot
// read its log, its replay failed, or its app's replay was interrupted.
func (st State) replayFailed() error {
	if st.Source != nil && st.Source.Error != "" {
		return fmt.Errorf("the target cannot replay: %s", st.Source.Error)
	}
	if st.Replay != nil && st.Replay.Error != "" {
		return fmt.Errorf("the target's replay failed: %s", st.Replay.Error)
	}
	return st.interrupted()
}

// Back-off between retried reads: from the poll interval, doubling, up to
// maxBackoff.
const maxBackoff = time.Second

// nextBackoff is the wait after one of d.
func nextBackoff(d time.Duration) time.Duration {
	return min(2*d, maxBackoff)
}

// stateRetry reads the state, retrying a transient failure with back-off
// for up to retry (and while ctx lasts). The error says how long it tried
// and how often.
func (c Client) stateRetry(ctx context.Context, poll, retry time.Duration) (State, error) {
	var first time.Time
	wait := poll
	for attempt := 1; ; attempt++ {
		st, err := c.State(ctx)
		if err == nil {
			return st, nil
		}
		if first.IsZero() {
			first = time.Now()
		}
		if !transient(err) || time.Since(first)+wait > retry {
			return st, fmt.Errorf("%d reads over %s: %w", attempt, time.Since(first).Round(time.Millisecond), err)
		}
		if serr := sleep(ctx, wait); serr != nil {
			return st, fmt.Errorf("%d reads over %s (last error: %v): %w", attempt, time.Since(first).Round(time.Millisecond), err, serr)
		}
		wait = nextBackoff(wait)
	}
}

// WaitSwitched waits until a target sidecar consumes the primary queue
// (its replay is done), and returns when the broker confirmed the switch.
// Failed reads are retried until timeout.
func (c Client) WaitSwitched(ctx context.Context, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		st, err := c.State(ctx)
		if err == nil {
			if ferr := st.replayFailed(); ferr != nil {
				return time.Time{}, ferr
			}
			if st.switched() {
				return st.switchedAt(), nil
			}
		}
		if serr := sleep(ctx, 20*time.Millisecond); serr != nil {
			return time.Time{}, fmt.Errorf("the target at %s did not switch to the primary queue in %s (last error: %v): %w", c.URL, timeout, err, serr)
		}
	}
}

// interrupted is an error if the target's app went away in the middle of
// its replay after settling replayed deliveries: a restarted app was
// restored from the checkpoint again and lacks them, and the target cannot
// tell a restart from a reconnect, so such a target is given up.
func (st State) interrupted() error {
	if st.Replay == nil || st.Replay.Interrupted == 0 {
		return nil
	}
	return fmt.Errorf("the target's app lost its connection in the middle of the replay (%d times), after it had processed replayed messages; if it was restarted, it was restored from the checkpoint again and lacks them, so the target cannot be trusted to be exact", st.Replay.Interrupted)
}

// lagBehind is how many of the source's deliveries up to last the target's
// app has not the effects of yet: those after the last replayed delivery it
// acked or, if it acked none, after the checkpoint ID (the replay range's
// start), which its restored memory already holds. Counting from 0 instead
// left a target with nothing to replay (a consumer idle since its
// checkpoint) at lag = checkpoint ID for ever.
func (st State) lagBehind(last uint64) uint64 {
	var acked uint64
	if st.Source != nil {
		acked = st.Source.Start
	}
	for _, q := range st.Queues {
		acked = max(acked, q.LastAckedID)
	}
	if last <= acked {
		return 0
	}
	return last - acked
}
