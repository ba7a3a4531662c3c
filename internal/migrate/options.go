package migrate

import (
	"time"

	"github.com/go-logr/logr"
)

// Timeouts bound the steps of a migration that do not wait for a pod (those
// take Plan.Timeout), in one place. A zero field takes its default
// (DefaultTimeouts).
type Timeouts struct {
	// Quiesce bounds the source sidecar's quiesce: settling what the app
	// holds and waiting for its acks to reach the broker.
	Quiesce time.Duration
	// Stop bounds a sidecar's stop at a cutoff (stop-and-copy,
	// statefulset): cancelling the app's consumers, handing it what was
	// held, and writing the cutoff marker.
	Stop time.Duration
	// Checkpoint is the kubelet's checkpoint call's own timeout (CRIU's
	// dump of the app).
	Checkpoint time.Duration
	// FreezeWatch bounds the node agent's watches during a live
	// checkpoint: for the app's freeze, and for CRIU's dump of it.
	FreezeWatch time.Duration
	// Sidecar bounds each HTTP request to a sidecar's control API when
	// Env.HTTP is not set.
	Sidecar time.Duration
	// Cleanup bounds each undo step of a failed migration (deleting a
	// target, resuming the source, deleting checkpoint images); they run
	// even when the migration's own context has ended.
	Cleanup time.Duration
	// Wait is Plan.Timeout's default: each wait for a pod to run or a
	// target to switch.
	Wait time.Duration
}

// DefaultTimeouts are the Timeouts of a zero field.
var DefaultTimeouts = Timeouts{
	Quiesce:     30 * time.Second,
	Stop:        60 * time.Second,
	Checkpoint:  time.Minute,
	FreezeWatch: time.Minute,
	Sidecar:     10 * time.Second,
	Cleanup:     time.Minute,
	Wait:        3 * time.Minute,
}

// withDefaults fills t's zero fields from DefaultTimeouts.
func (t Timeouts) withDefaults() Timeouts {
	d := DefaultTimeouts
	for _, f := range []struct{ v, def *time.Duration }{
		{&t.Quiesce, &d.Quiesce}, {&t.Stop, &d.Stop}, {&t.Checkpoint, &d.Checkpoint}, {&t.FreezeWatch, &d.FreezeWatch},
		{&t.Sidecar, &d.Sidecar}, {&t.Cleanup, &d.Cleanup}, {&t.Wait, &d.Wait},
	} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	return t
}

// Clock tells the time: a migration's timings and deadlines read it, so
// that a test can control them.
type Clock interface {
	Now() time.Time
}

// SystemClock is the system's clock, the default of Env.Clock.
var SystemClock Clock = systemClock{}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// discard is the logger of an Env without one.
var discard = logr.Discard()
