package migrate

import (
	"context"
	"time"

	"github.com/ms2m/ms2m/internal/pullsecret"
)

// pullAhead has the target node's agent pull the checkpoint image while
// the kubelet sets the target pod up (its sandbox, its sidecar and the
// sidecar's startup probe), so that the kubelet finds the image on the
// node when it comes to the app container (Plan.PullAhead). The image is
// the one the target names, by digest: the restore is the same either
// way. A failed pull fails nothing, since the kubelet then pulls it
// itself. wait blocks until the agent's pull has ended and says how long
// it took, or why it failed.
func (r *run) pullAhead(ctx context.Context) (wait func() (time.Duration, string)) {
	type pulled struct {
		took time.Duration
		err  string
	}
	ch := make(chan pulled, 1)
	src, image := r.source, r.rep.Image
	go func() {
		began := r.now()
		// With the pod's own pull secret for the checkpoint image's
		// registry, as the kubelet will pull it; without one if it
		// cannot be read (the node's own credentials apply).
		auth, _, err := pullsecret.ForPod(ctx, r.env.Client, src, image)
		if err != nil {
			auth = nil
		}
		if err := r.env.Agent.PullImage(ctx, r.p.TargetNode, image, auth); err != nil {
			ch <- pulled{err: err.Error()}
			return
		}
		ch <- pulled{took: r.now().Sub(began)}
	}()
	return func() (time.Duration, string) {
		select {
		case p := <-ch:
			return p.took, p.err
		case <-ctx.Done():
			return 0, "the migration ended before the pull: " + ctx.Err().Error()
		}
	}
}
