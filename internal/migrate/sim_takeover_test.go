package migrate_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/testenv"
)

// afterSwitch is the migrator's HTTP transport with a fault: once the
// migration's target has switched to the primary queue, reads of its
// sidecar's state fail while fail() says so (the network to the target is
// cut, its sidecar restarts...).
type afterSwitch struct {
	c      *simcluster.Cluster
	ns     string
	target string
	// fail is asked at each read of the switched target's state; true
	// fails it.
	fail   func() bool
	failed atomic.Int64
}

// The mode is read after the real round trip: a read that the sidecar
// answered while switching (its answer may say serving) is lost too, so
// the fault fires however the switch and the read interleave. (Read before
// the request, a loaded machine could let the one read that saw the switch
// through, and the fault never fired.)
func (a *afterSwitch) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if req.URL.Path != "/state" {
		return resp, err
	}
	if sp := a.c.Nodes[nodeB].Pod(a.ns, a.target); sp != nil && sp.Sidecar != nil {
		host, _, _ := net.SplitHostPort(req.URL.Host)
		if host == sp.IP && sp.Sidecar.Mode() == simcluster.ModeServing && a.fail() {
			if err == nil {
				resp.Body.Close()
			}
			a.failed.Add(1)
			return nil, errors.New("injected: the target's sidecar does not answer")
		}
	}
	return resp, err
}

// TestFailedReadsAfterTheSwitch: a migration whose reads of the target
// fail after the target has taken over never deletes that target and
// never resumes the source beside it (ARCHITECTURE.md, I5). Reads that
// fail for a while are retried and the migration completes; a migrator
// whose context ends after the switch finds out that the target took over
// and completes the migration; a target that stays unreachable is kept,
// with the source stopped, and the error says what to do. Before, each of
// these deleted the target that served and resumed the source.
func TestFailedReadsAfterTheSwitch(t *testing.T) {
	c := cluster(t)
	for _, tc := range []struct {
		name, ns string
		// shadow: a statefulset-shadow migration, whose shadow is the
		// target here; else ms2m.
		shadow bool
		// fault returns the transport's fail func; cancel ends the
		// migration's context.
		fault func(cancel context.CancelFunc) func() bool
		// completes: the migration succeeds and the target serves;
		// otherwise both are kept, the source stopped.
		completes bool
		want      []string
	}{
		{"reads fail for a while", "sim-takeover-retry", false, func(context.CancelFunc) func() bool {
			var n atomic.Int64
			return func() bool { return n.Add(1) <= 5 }
		}, true, nil},
		{"the migrator's context ends after the switch", "sim-takeover-ctx", false, func(cancel context.CancelFunc) func() bool {
			var once sync.Once
			return func() bool {
				failed := false
				once.Do(func() { cancel(); failed = true })
				return failed
			}
		}, true, nil},
		{"the target stays unreachable", "sim-takeover-lost", false, func(context.CancelFunc) func() bool {
			return func() bool { return true }
		}, false, []string{"reading the target failed", "cannot tell whether the target target-ms2m took over", "so the target is kept and the source", "stays stopped, never both consuming"}},
		{"the shadow stays unreachable", "sim-takeover-shadow", true, func(context.CancelFunc) func() bool {
			return func() bool { return true }
		}, false, []string{"reading the target failed", "cannot tell whether the target m-statefulset-shadow-shadow took over", "so the shadow is kept and the source consumer-0 stays stopped, never both consuming"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(c)
			owner, strategy := "Deployment", contract.StrategyMS2M
			if tc.shadow {
				owner, strategy = "StatefulSet", contract.StrategyStatefulSetShadow
			}
			w := deploy(t, c, tc.ns+"-"+strconv.Itoa(int(time.Now().UnixNano()%1e6)), owner, true)
			p := plan(w, strategy)
			target := p.TargetPod
			if tc.shadow {
				target = migrate.ShadowName(p.Name)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			tr := &afterSwitch{c: c, ns: w.ns, target: target, fail: tc.fault(cancel)}
			e := env(c, c.Client)
			e.HTTP = &http.Client{Timeout: 10 * time.Second, Transport: tr}
			e.ReadRetry = 2 * time.Second // the default, 20 s, twice for each unreachable target
			rep, err := migrate.Run(ctx, e, p)
			if tr.failed.Load() == 0 {
				t.Fatalf("no read of the switched target failed (err %v): the fault did not fire", err)
			}
			if tc.completes {
				if err != nil {
					t.Fatalf("the migration failed: %v", err)
				}
				target := checkServing(t, c, w, rep)
				checkPods(t, c, w, rep, target)
				return
			}
			if err == nil {
				t.Fatal("the migration succeeded with an unreachable target")
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("err = %v\nwant it to say %q", err, s)
				}
			}
			if _, gerr := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), target, metav1.GetOptions{}); gerr != nil {
				t.Errorf("the target that may have taken over was deleted: %v", gerr)
			}
			if sp := c.Nodes[nodeB].Pod(w.ns, target); sp == nil || sp.Sidecar.Mode() != simcluster.ModeServing {
				t.Errorf("the target does not serve on node B")
			}
			src := c.Nodes[nodeA].Pod(w.ns, w.pod.Name)
			if _, gerr := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), w.pod.Name, metav1.GetOptions{}); gerr != nil || src == nil {
				t.Fatalf("the source is gone: %v", gerr)
			}
			if m := src.Sidecar.Mode(); m != simcluster.ModeStopped {
				t.Errorf("the source's sidecar is %s, want stopped: it consumes beside a target that took over", m)
			}
		})
	}
}

// TestLostHoldDiscardsTheCheckpoint: a source sidecar that does not stay
// quiesced until its checkpoint is taken (here another party resumes it;
// a restarted sidecar comes back serving the same way) hands its app
// deliveries after the checkpoint ID. The migrator's resume under the
// quiesce's hold gets 409, and the migration fails before it builds an
// image or creates a target; the source serves. Before, the resume
// answered OK and the target was restored from that checkpoint.
func TestLostHoldDiscardsTheCheckpoint(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	w := deploy(t, c, "sim-lost-hold-"+strconv.Itoa(int(time.Now().UnixNano()%1e6)), "Deployment", true)
	p := plan(w, contract.StrategyMS2M)
	p.Name = "m-lost-hold"
	h := c.Nodes[nodeA].HoldStep(simcluster.StepCheckpoint)
	defer h.Release()
	type result struct {
		rep migrate.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := migrate.Run(t.Context(), env(c, c.Client), p)
		done <- result{rep, err}
	}()
	select {
	case <-h.Reached:
	case r := <-done:
		t.Fatalf("the migration ended before its checkpoint: %v", r.err)
	}
	src := control.ClientAt(w.pod.Status.PodIP, 8089, c.ControlToken(w.ns), nil)
	if err := src.Resume(t.Context()); err != nil {
		t.Fatal(err)
	}
	sp := c.Nodes[nodeA].Pod(w.ns, w.pod.Name)
	before := sp.App.State().Last
	testenv.Eventually(t, 10*time.Second, "the resumed source processes deliveries after the checkpoint ID", func() bool { return sp.App.State().Last > before+2 })
	h.Release()
	r := <-done
	if r.err == nil {
		t.Fatal("the migration succeeded from a checkpoint taken while the source served")
	}
	for _, s := range []string{"409 Conflict", "holds no quiesce", "is discarded (no image is built from it) and nothing was deleted"} {
		if !strings.Contains(r.err.Error(), s) {
			t.Errorf("err = %v\nwant it to say %q", r.err, s)
		}
	}
	if r.rep.Image != "" {
		t.Errorf("an image %s was built from the discarded checkpoint", r.rep.Image)
	}
	if _, err := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), p.TargetPod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a target was created (err %v)", err)
	}
	expectServing(t, c, w)
	expectNoImage(t, migrate.CheckpointRef(c.ImageRepo(), w.ns, p.Name, c.SigningKey))
}
