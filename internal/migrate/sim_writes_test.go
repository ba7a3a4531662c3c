package migrate_test

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestWritesFailingAfterTheSwitch: the controller's writes to the API fail
// for a few seconds right after the target took over (found by the soak,
// hack/soak -mode sim): the source cannot be deleted, nor the failure
// recorded. Once the writes go through again, the migration ends (the
// target serves; the source is gone) with a status that says so, and no
// Running status is left behind for nobody to finish.
func TestWritesFailingAfterTheSwitch(t *testing.T) {
	c := cluster(t)
	for _, strategy := range []contract.Strategy{contract.StrategyMS2M, contract.StrategyMS2MCutoff} {
		t.Run(string(strategy), func(t *testing.T) {
			ns := "sim-writes-" + strconv.Itoa(int(time.Now().UnixNano()%1e6))
			resetNodes(c)
			defer resetNodes(c)
			w := deploy(t, c, ns, "Deployment", true)
			g, err := c.NewGate()
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			// The point right after the switch: the source's patch that
			// marks it first to scale down. From there, every write in the
			// namespace fails for 3 s.
			h := g.HoldRequest(func(r simcluster.Request) bool {
				return r.Method == http.MethodPatch && strings.HasSuffix(r.Path, "/pods/"+w.pod.Name) && bytes.Contains(r.Body, []byte(migrate.DeletionCostAnnotation))
			})
			defer h.Release()
			ctl := startController(t, c, "the controller", g.Kubeconfig)
			requestMigration(t, c, w, strategy)
			select {
			case <-h.Reached:
			case <-time.After(time.Minute):
				t.Fatalf("the migration never switched; the controller's log:\n%s", ctl.out.String())
			}
			stop := g.FailRequests(func(r simcluster.Request) bool {
				return r.Method != http.MethodGet && strings.Contains(r.Path, "/namespaces/"+ns+"/")
			})
			h.Release()
			time.Sleep(3 * time.Second) // the fault's window: how long the writes fail
			if n := stop(); n == 0 {
				t.Fatal("no write failed: the fault did not fire")
			}

			pod, st := finalStatus(t, c, ns, 90*time.Second)
			t.Logf("%s on %s: %s", st.Phase, pod.Name, st.Message)
			if st.Phase != contract.PhaseSucceeded {
				t.Errorf("the migration ended %s (%s), want Succeeded: the target had taken over", st.Phase, st.Message)
			}
			target := checkServing(t, c, w, migrate.Report{TargetPod: pod.Name})
			testenv.Eventually(t, 15*time.Second, "only the target is left", func() bool {
				pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
				return err == nil && len(pods.Items) == 1 && pods.Items[0].UID == target.UID
			})
		})
	}
}

// TestSourceGoneBeforeTheFailureIsRecorded: the target took over and the
// ReplicaSet has it, but the controller's delete of the source fails, and
// by the time the controller records the outcome on the source, the
// ReplicaSet has deleted the source itself (it is marked first to scale
// down). Found by the soak (hack/soak -mode sim, api-writes-fail): the
// migration was then recorded nowhere, the request's pod being gone. The
// outcome belongs on the target, which serves: Succeeded, with what
// failed after the takeover among its warnings.
func TestSourceGoneBeforeTheFailureIsRecorded(t *testing.T) {
	c := cluster(t)
	ns := "sim-gone-" + strconv.Itoa(int(time.Now().UnixNano()%1e6))
	resetNodes(c)
	defer resetNodes(c)
	w := deploy(t, c, ns, "Deployment", true)
	g, err := c.NewGate()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	// The controller's delete of the source is held until the ReplicaSet
	// has deleted the source, and then fails, as do its deletes for a
	// second more.
	deleteSource := func(r simcluster.Request) bool {
		return r.Method == http.MethodDelete && strings.HasSuffix(r.Path, "/namespaces/"+ns+"/pods/"+w.pod.Name)
	}
	stop := g.FailRequests(deleteSource)
	h := g.HoldRequest(deleteSource)
	defer h.Release()
	ctl := startController(t, c, "the controller", g.Kubeconfig)
	requestMigration(t, c, w, contract.StrategyMS2M)
	select {
	case <-h.Reached:
	case <-time.After(time.Minute):
		t.Fatalf("the controller never deleted the source; its log:\n%s", ctl.out.String())
	}
	testenv.Eventually(t, 30*time.Second, "the ReplicaSet deletes the source", func() bool {
		_, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), w.pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	h.Release()
	time.Sleep(time.Second) // the fault's window: the deletes fail meanwhile
	if n := stop(); n == 0 {
		t.Fatal("no write failed: the fault did not fire")
	}
	pod, st := finalStatus(t, c, ns, 30*time.Second)
	t.Logf("%s on %s: %s", st.Phase, pod.Name, st.Message)
	if st.Phase != contract.PhaseSucceeded || pod.UID == w.pod.UID {
		t.Errorf("the migration ended %s on %s, want Succeeded on the target", st.Phase, pod.Name)
	}
	if st.Report == nil || len(st.Report.Warnings) == 0 {
		t.Errorf("the status's report %+v: want the failed delete among its warnings", st.Report)
	}
	checkServing(t, c, w, migrate.Report{TargetPod: pod.Name})
}

// TestOutcomeWriteFailsOnce: the migration succeeds, but the controller's
// first write of the outcome on the pod that took over fails (found by the
// soak: a StatefulSet's migration was then recorded nowhere, since the
// recreated pod carries no request for a retry to act on, and a
// Deployment's source is gone by then). The write is tried again.
func TestOutcomeWriteFailsOnce(t *testing.T) {
	c := cluster(t)
	for _, tc := range []struct {
		strategy contract.Strategy
		owner    string
	}{
		{contract.StrategyMS2M, "Deployment"},
		{contract.StrategyStatefulSet, "StatefulSet"},
	} {
		t.Run(string(tc.strategy), func(t *testing.T) {
			ns := "sim-outcome-" + strconv.Itoa(int(time.Now().UnixNano()%1e6))
			resetNodes(c)
			defer resetNodes(c)
			w := deploy(t, c, ns, tc.owner, true)
			g, err := c.NewGate()
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			outcome := func(r simcluster.Request) bool {
				return r.Method == http.MethodPatch && strings.Contains(r.Path, "/namespaces/"+ns+"/pods/") && bytes.Contains(r.Body, []byte(string(contract.PhaseSucceeded)))
			}
			stop := g.FailRequests(outcome)
			h := g.HoldRequest(outcome)
			defer h.Release()
			ctl := startController(t, c, "the controller", g.Kubeconfig)
			requestMigration(t, c, w, tc.strategy)
			select {
			case <-h.Reached:
			case <-time.After(time.Minute):
				t.Fatalf("the controller never recorded the outcome; its log:\n%s", ctl.out.String())
			}
			// The held write fails when it goes on; the one after it is
			// the retry, held again until the writes go through.
			retry := g.HoldRequest(outcome)
			defer retry.Release()
			h.Release()
			select {
			case <-retry.Reached:
			case <-time.After(30 * time.Second):
				t.Fatalf("the failed write of the outcome was not tried again; the controller's log:\n%s", ctl.out.String())
			}
			if n := stop(); n == 0 {
				t.Fatal("no write failed: the fault did not fire")
			}
			retry.Release()
			pod, st := finalStatus(t, c, ns, 30*time.Second)
			if st.Phase != contract.PhaseSucceeded {
				t.Errorf("the migration ended %s on %s (%s), want Succeeded", st.Phase, pod.Name, st.Message)
			}
			checkServing(t, c, w, migrate.Report{TargetPod: pod.Name})
		})
	}
}
