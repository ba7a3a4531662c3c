package migrate_test

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/testenv"
)

// Faults of the StatefulSet strategies after the source is gone, where
// only the pending-migration record and the log can bring the pod's state
// back (docs/faults.md has the whole matrix).

func suffix() string { return strconv.Itoa(int(time.Now().UnixNano() % 1e6)) }

// expectCompleted waits for the restarted controller to end the migration
// Succeeded on the StatefulSet's pod, and checks that it serves on node B
// with every delivery processed once, alone, with no record left.
func expectCompleted(t *testing.T, c *simcluster.Cluster, w *workload) {
	t.Helper()
	pod, st := finalStatus(t, c, w.ns, 2*time.Minute)
	t.Logf("%s on %s: %s", st.Phase, pod.Name, st.Message)
	if st.Phase != contract.PhaseSucceeded {
		t.Fatalf("the migration ended %s (%s), want %s", st.Phase, st.Message, contract.PhaseSucceeded)
	}
	target := checkServing(t, c, w, migrate.Report{TargetPod: w.pod.Name})
	testenv.Eventually(t, 15*time.Second, "only the StatefulSet's pod is left", func() bool {
		pods, err := c.Client.CoreV1().Pods(w.ns).List(t.Context(), metav1.ListOptions{})
		return err == nil && len(pods.Items) == 1 && pods.Items[0].UID == target.UID
	})
	for _, p := range w.created.all()[1:] {
		if !strings.Contains(p.Annotations[contract.AnnotationStatus], `"restore"`) {
			t.Errorf("pod %s was created without a restore: it would start with empty state", p.Name)
		}
	}
	if _, err := c.Client.CoreV1().ConfigMaps(w.ns).Get(t.Context(), contract.PendingConfigMapName(w.pod.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pending-migration ConfigMap is left (err %v)", err)
	}
}

// servingShadow returns the name of the pod that serves on node B beside
// the StatefulSet's pod: the shadow.
func servingShadow(t *testing.T, c *simcluster.Cluster, w *workload) string {
	t.Helper()
	for _, sp := range c.Nodes[nodeB].Pods(w.ns) {
		if sp.Name != w.pod.Name && sp.Sidecar.Mode() == simcluster.ModeServing {
			return sp.Name
		}
	}
	t.Fatal("no shadow serves on node B")
	return ""
}

// TestFinishPendingWithADeadShadow: the migrator of a statefulset-shadow
// migration stops while the StatefulSet's restored pod replays, and the
// shadow dies before its handover (its containers crash, its sidecar
// answers no more): no cutoff marker will ever come. The restarted
// controller deletes the dead shadow, waits until its node confirms it
// stopped, records the log's end as the restore's cutoff and has the
// StatefulSet make the pod again: it replays through the shadow's last
// record and serves, every delivery once. Before, FinishPending waited
// for the marker nobody writes, and the migration never ended.
func TestFinishPendingWithADeadShadow(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	w := deploy(t, c, "sim-dead-shadow-"+suffix(), "StatefulSet", true)
	g, err := c.NewGate()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	reached, rel := inReplay(1)(t, c, g, w)
	var once sync.Once
	release := func() { once.Do(rel) }
	defer release()
	first := startController(t, c, "the first controller", g.Kubeconfig)
	requestMigration(t, c, w, contract.StrategyStatefulSetShadow)
	select {
	case <-reached:
	case <-time.After(time.Minute):
		t.Fatalf("the StatefulSet's pod never replayed; the controller's log:\n%s", first.out.String())
	}
	first.kill()
	shadow := servingShadow(t, c, w)
	if err := c.Nodes[nodeB].Kill(t.Context(), w.ns, shadow); err != nil {
		t.Fatal(err)
	}
	release()
	startController(t, c, "the restarted controller", c.Kubeconfig)
	expectCompleted(t, c, w)
	expectEvent(t, c, w.ns, contract.ReasonMigrationRestoreRedone)
}

// holdingTransport holds the requests match picks until release is
// closed; reached is closed at the first.
type holdingTransport struct {
	match   func(*http.Request) bool
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *holdingTransport) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if h.match(req) {
			h.once.Do(func() { close(h.reached) })
			select {
			case <-h.release:
			case <-req.Context().Done():
				return nil, req.Context().Err()
			}
		}
		return rt.RoundTrip(req)
	})
}

// TestRestoredPodDeletedAfterItServed: a StatefulSet's restored pod that
// took over and processed live deliveries is deleted before its
// pending-migration record is (here the migrator's delete of the record
// is held; a node drain or an eviction does the same). The StatefulSet
// makes the pod again from the record, and its sidecar finds deliveries
// beyond the cutoff in the log, which only its predecessor can have taken:
// it replays through them (replay.Range.LogEnd) and serves on, every
// delivery once. Before, the pod was restored to the old cutoff and
// skipped what its predecessor had processed ("gap: ... delivered 12 after
// 10").
func TestRestoredPodDeletedAfterItServed(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	w := deploy(t, c, "sim-served-again-"+suffix(), "StatefulSet", true)
	p := plan(w, contract.StrategyStatefulSet)
	ht := &holdingTransport{reached: make(chan struct{}), release: make(chan struct{}), match: func(r *http.Request) bool {
		return r.Method == http.MethodDelete && strings.Contains(r.URL.Path, "/configmaps/"+contract.PendingConfigMapName(w.pod.Name))
	}}
	var once sync.Once
	releaseHold := func() { once.Do(func() { close(ht.release) }) }
	defer releaseHold()
	e := env(c, c.Client)
	cfg := *c.Config
	cfg.WrapTransport = ht.wrap
	cs, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Client = cs
	type result struct {
		rep migrate.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := migrate.Run(t.Context(), e, p)
		done <- result{rep, err}
	}()
	select {
	case <-ht.reached:
	case r := <-done:
		t.Fatalf("the migration ended before it deleted its record: %v", r.err)
	}
	first := c.Nodes[nodeB].Pod(w.ns, w.pod.Name)
	if first == nil || first.Sidecar.Mode() != simcluster.ModeServing {
		t.Fatal("the restored pod does not serve on node B")
	}
	cutoff := first.App.State().Last
	testenv.Eventually(t, 10*time.Second, "the restored pod processes live deliveries", func() bool { return first.App.State().Last > cutoff+3 })
	if err := c.Client.CoreV1().Pods(w.ns).Delete(t.Context(), w.pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &first.UID}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the StatefulSet makes the pod again on node B", func() bool {
		sp := c.Nodes[nodeB].Pod(w.ns, w.pod.Name)
		return sp != nil && sp.UID != first.UID && sp.Sidecar != nil && sp.Sidecar.Mode() == simcluster.ModeServing
	})
	releaseHold()
	r := <-done
	if r.err != nil {
		t.Fatalf("migrate: %v", r.err)
	}
	checkServing(t, c, w, r.rep)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestStatefulSetReplayInterrupted: a StatefulSet's restored pod whose
// replay is interrupted after it replayed some records is recovered
// exactly, for both StatefulSet strategies: a pod deleted mid-replay is
// made again by its StatefulSet as the same restore; a pod whose app
// restarted mid-replay (its app came back from the checkpoint without
// what it had replayed) is deleted by the controller and made again. Each
// ends with the pod serving on node B and every delivery processed once;
// had a recreated pod started with empty state, kept the restarted app's
// state, or replayed from the wrong place, the app's check fails.
func TestStatefulSetReplayInterrupted(t *testing.T) {
	c := cluster(t)
	for _, tc := range []struct {
		name     string
		strategy contract.Strategy
		// appOnly: the app restarts; else the pod is deleted.
		appOnly bool
	}{
		{"statefulset, pod deleted", contract.StrategyStatefulSet, false},
		{"statefulset-shadow, pod deleted", contract.StrategyStatefulSetShadow, false},
		{"statefulset, app restarted", contract.StrategyStatefulSet, true},
		{"statefulset-shadow, app restarted", contract.StrategyStatefulSetShadow, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(c)
			defer resetNodes(c)
			w := deploy(t, c, "sim-interrupted-"+suffix(), "StatefulSet", true)
			// The pod the restore comes from (the source, or the shadow on
			// node B) serves on while its checkpoint image is built, so that
			// the restore has more records to replay than it holds after.
			from := c.Nodes[nodeA]
			if tc.strategy == contract.StrategyStatefulSetShadow {
				from = c.Nodes[nodeB]
			}
			h := from.HoldStep(simcluster.StepImage)
			defer h.Release()
			go func() {
				<-h.Reached
				defer h.Release()
				var app *simcluster.App
				for _, sp := range from.Pods(w.ns) {
					if sp.Sidecar.Mode() == simcluster.ModeServing {
						app = sp.App
					}
				}
				if app == nil {
					return
				}
				at := app.State().Last
				for deadline := time.Now().Add(10 * time.Second); app.State().Last < at+6 && time.Now().Before(deadline); {
					time.Sleep(20 * time.Millisecond) // polls the condition
				}
			}()
			// The StatefulSet's restored pod (not the shadow) holds after 2
			// replayed records.
			stopArm := make(chan struct{})
			defer close(stopArm)
			go func() {
				skip := 0
				if tc.strategy == contract.StrategyStatefulSetShadow {
					skip = 1
				}
				for {
					select {
					case <-stopArm:
						return
					case <-time.After(5 * time.Millisecond):
					}
					serving := 0
					for _, sp := range c.Nodes[nodeB].Pods(w.ns) {
						if sp.Sidecar.Mode() == simcluster.ModeServing {
							serving++
						}
					}
					if serving >= skip {
						c.Nodes[nodeB].HoldReplaysAfter(2)
						return
					}
				}
			}()
			startController(t, c, "the controller", c.Kubeconfig)
			requestMigration(t, c, w, tc.strategy)
			var restored *simcluster.SimPod
			testenv.Eventually(t, time.Minute, "the StatefulSet's restored pod has replayed 2 records", func() bool {
				sp := c.Nodes[nodeB].Pod(w.ns, w.pod.Name)
				if sp == nil || sp.Sidecar == nil || sp.Sidecar.Mode() != simcluster.ModeReplaying {
					return false
				}
				st := sp.Sidecar.State()
				restored = sp
				return st.Replay != nil && st.Replay.Replayed == 2
			})
			// The migrator watches it (reads its sidecar's state): what it
			// does from here on (the record kept, the pod's recreation
			// followed) is under test.
			testenv.Eventually(t, 30*time.Second, "the migrator reads the restored pod's sidecar", func() bool { return restored.StateReads() > 0 })
			if tc.appOnly {
				if err := c.Nodes[nodeB].RestartApp(t.Context(), w.ns, w.pod.Name); err != nil {
					t.Fatal(err)
				}
				if st := restored.Sidecar.State(); st.Replay == nil || st.Replay.Interrupted != 1 {
					t.Fatalf("the app's restart did not interrupt the replay (state %+v): the fault did not fire", st.Replay)
				}
			} else if err := c.Client.CoreV1().Pods(w.ns).Delete(t.Context(), w.pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &restored.UID}}); err != nil {
				t.Fatal(err)
			}
			c.Nodes[nodeB].HoldReplaysAfter(0) // this replay and the next go on
			expectCompleted(t, c, w)
			if sp := c.Nodes[nodeB].Pod(w.ns, w.pod.Name); sp == nil || sp.UID == restored.UID {
				t.Error("the interrupted restore was not made again")
			}
		})
	}
}
