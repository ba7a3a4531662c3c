package migrate

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/control"
)

// Takeover is what a migrator that is about to undo a migration found out
// about its target (or shadow): whether it took over from the source.
type Takeover int

const (
	// NotTakenOver: the target never consumed the primary queue, so it may
	// be deleted and the source resumed.
	NotTakenOver Takeover = iota
	// TookOver: the target replayed to the cutoff and consumes the primary
	// queue; it holds deliveries the source never saw, so the migration is
	// completed instead (the source goes, or stays stopped).
	TookOver
	// TakeoverUnknown: the target's sidecar could not be read while its pod
	// runs. Deleting it could lose what it processed, resuming the source
	// beside it could consume twice: neither is done.
	TakeoverUnknown
)

func (t Takeover) String() string {
	switch t {
	case NotTakenOver:
		return "not taken over"
	case TookOver:
		return "took over"
	}
	return "unknown"
}

// TargetTakeover tells whether target, a migration's target or shadow pod
// as the API server has it now (nil if it is gone), has taken over from
// the source; c is its sidecar's control API. A failed read is retried for
// up to retry (0: one read). A pod that never got an IP, or that no longer
// runs, consumes nothing. The migrator's rollback after a failed handover
// and the controller's rollback of a migration a killed migrator left both
// decide by it. retry is by clk.
func TargetTakeover(ctx context.Context, clk Clock, target *corev1.Pod, c control.Client, retry time.Duration) (Takeover, error) {
	if target == nil || target.Status.PodIP == "" {
		return NotTakenOver, nil
	}
	deadline := clk.Now().Add(retry)
	wait := 100 * time.Millisecond
	for {
		switched, err := c.Switched(ctx)
		switch {
		case err == nil && switched:
			return TookOver, nil
		case err == nil:
			return NotTakenOver, nil
		case target.Status.Phase != corev1.PodRunning:
			return NotTakenOver, nil
		case clk.Now().Add(wait).After(deadline) || ctx.Err() != nil:
			return TakeoverUnknown, fmt.Errorf("cannot tell whether the target %s took over: %w", target.Name, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// checkTakeover finds out, after err, whether the pod named name (the
// target or the shadow) took over, reading the pod and its sidecar again
// for up to Env.ReadRetry while that is unknown: a pod that goes
// meanwhile (deleted, say) took nothing over. It runs on a context of its
// own, so that a migration whose context ended still finds out.
// lastReadSlack is how long checkTakeover's last read may take beyond
// Env.ReadRetry.
const lastReadSlack = 15 * time.Second

func (r *run) checkTakeover(ctx context.Context, name string) (*corev1.Pod, Takeover, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.env.ReadRetry+lastReadSlack)
	defer cancel()
	deadline := r.now().Add(r.env.ReadRetry)
	wait := 100 * time.Millisecond
	for {
		pod, err := r.env.Client.CoreV1().Pods(r.p.Namespace).Get(ctx, name, metav1.GetOptions{})
		v := TakeoverUnknown
		switch {
		case apierrors.IsNotFound(err):
			return nil, NotTakenOver, nil
		case err != nil:
			err = fmt.Errorf("cannot tell whether the target %s took over: read its pod: %w", name, err)
		default:
			v, err = TargetTakeover(ctx, r.env.Clock, pod, r.endpoint(pod), 0)
		}
		if v != TakeoverUnknown || r.now().Add(wait).After(deadline) {
			return pod, v, err
		}
		select {
		case <-ctx.Done():
			return pod, v, err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// afterStop decides what a migration that failed with err, after it had
// asked the source to stop, does with its target (named name). It returns
// handled false when the target did not take over: the caller rolls back
// as before. Otherwise it returns the migration's outcome: nil once a
// target that took over is kept and the source deleted (the migration is
// complete), or an error that says what is left where when the target's
// state is unknown (the target is kept, the source stays stopped).
func (r *run) afterStop(ctx context.Context, err error, name string) (handled bool, out error) {
	target, v, terr := r.checkTakeover(ctx, name)
	switch v {
	case TookOver:
		r.rep.Note = fmt.Sprintf("the handover reported %q, but the target %s had taken over: the migration was completed; its handover timings are unknown", err, name)
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.p.Timeout)
		defer cancel()
		if ferr := Finish(fctx, r.env.Clock, r.env.Client, r.source, target.Name, r.p.Timeout); ferr != nil {
			return true, fmt.Errorf("%w; but the target %s had taken over and serves, so it is kept and the source %s stays stopped; completing the migration failed: %w", err, name, r.p.Pod, ferr)
		}
		return true, nil
	case TakeoverUnknown:
		return true, fmt.Errorf("%w; %w, so the target is kept and the source %s stays stopped, never both consuming: read the target's GET /state, and if replay.switchedAt is set delete the source, else delete the target and POST /resume the source's sidecar", err, terr, r.p.Pod)
	}
	return false, err
}
