package migrate_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/testenv"
)

// An app container that restarts after its pod was restored comes back
// from the checkpoint image, without what it processed since (the
// simulated node restarts it that way, as the kubelet does).

// restartServedApp restarts the app of pod, a restored pod that serves
// on node B, and checks that the fault fired: its app went back to the
// checkpoint.
func restartServedApp(t *testing.T, c *simcluster.Cluster, pod *corev1.Pod) {
	t.Helper()
	sp := c.Nodes[nodeB].Pod(pod.Namespace, pod.Name)
	before := sp.App.State()
	if err := c.Nodes[nodeB].RestartApp(t.Context(), pod.Namespace, pod.Name); err != nil {
		t.Fatal(err)
	}
	if after := sp.App.State(); after.Count >= before.Count {
		t.Fatalf("the app's restart did not take it back to the checkpoint (%d processed before, %d after): the fault did not fire", before.Count, after.Count)
	}
}

// TestAppRestartAfterTheMigration: a Deployment's pod, migrated by ms2m
// and serving, has its app container restarted. The controller sees the
// restartCount grow, stops the pod's sidecar (an Event says why), and
// restores the same checkpoint again on the same node in a copy held by
// the pod, which replays the log from the checkpoint ID to the stop's
// cutoff, takes over and goes to the ReplicaSet; the restarted pod goes.
// The copy's app has processed every delivery once, in order. On the code
// before, the restarted app went on consuming live on the checkpoint's
// state ("gap: the primary queue delivered 57 after 10").
//
// If the log no longer holds the records after the checkpoint
// (retention), the copy's replay fails before it consumes anything: the
// copy is deleted, the pod stays stopped (nothing is consumed on the
// wrong state), and it carries the condition ms2m.io/StateNotRebuilt
// with a Warning Event.
func TestAppRestartAfterTheMigration(t *testing.T) {
	c := cluster(t)
	for _, tc := range []struct {
		name      string
		retention bool
	}{
		{"rebuilt", false},
		{"the log's records are gone", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(c)
			defer resetNodes(c)
			w := deploy(t, c, "sim-app-restart-"+suffix(), "Deployment", true)
			startController(t, c, "the controller", c.Kubeconfig)
			requestMigration(t, c, w, contract.StrategyMS2M)
			served := waitMigrated(t, c, w.ns, w.pod, nodeB, "")
			log := c.Log(inject.LogName(served))
			if tc.retention {
				testenv.Eventually(t, 10*time.Second, "the log holds records to drop", func() bool { return log.LastID() > 2 })
				start := checkpointOf(t, served)
				log.DropThrough(start + 1)
			}
			restartServedApp(t, c, served)
			expectEventOn(t, c, w.ns, served.Name, contract.ReasonAppRestarted, "came back from the checkpoint")
			if tc.retention {
				expectNotRebuilt(t, c, w, served)
				return
			}
			expectEventOn(t, c, w.ns, served.Name, contract.ReasonStateRebuilt, "the state was rebuilt")
			copyName := migrate.RebuildPodName(served)
			var got *corev1.Pod
			if !within(time.Minute, func() bool {
				list, err := c.Client.CoreV1().Pods(w.ns).List(t.Context(), metav1.ListOptions{})
				if err != nil || len(list.Items) != 1 || list.Items[0].Name != copyName {
					return false
				}
				got = &list.Items[0]
				ctrl := metav1.GetControllerOf(got)
				return ctrl != nil && ctrl.Kind == "ReplicaSet" && got.Annotations[contract.AnnotationRestoredFrom] != ""
			}) {
				st := c.Nodes[nodeB].Pod(w.ns, served.Name).App.State()
				t.Fatalf("no copy %s alone serves after a minute; the restarted pod's app processed %d, the last %d, out of order: %v", copyName, st.Count, st.Last, st.Violations)
			}
			if got.Spec.NodeName != nodeB {
				t.Errorf("the copy runs on %s, want %s (where the checkpoint image is)", got.Spec.NodeName, nodeB)
			}
			sp := c.Nodes[nodeB].Pod(w.ns, copyName)
			if sp == nil || sp.UID != got.UID || !sp.Restored {
				t.Fatalf("node %s does not run the copy %s restored from the checkpoint", nodeB, copyName)
			}
			before := sp.App.State().Last
			testenv.Eventually(t, 10*time.Second, "the copy processes new deliveries", func() bool { return sp.App.State().Last > before+3 })
			st := sp.App.State()
			if len(st.Violations) > 0 {
				t.Errorf("the copy's app saw deliveries out of order: %v", st.Violations)
			}
			if last := log.LastID(); st.Count != st.Last || st.Last+1 < last {
				t.Errorf("the copy's app processed %d deliveries, the last %d; the log holds %d: want each of them once", st.Count, st.Last, last)
			}
			for _, p := range w.created.all() {
				if p.Name != w.pod.Name && !strings.Contains(p.Annotations[contract.AnnotationStatus], `"restore"`) {
					t.Errorf("pod %s was created without a restore: it would start with empty state", p.Name)
				}
			}
		})
	}
}

// checkpointOf is the checkpoint ID pod was restored after.
func checkpointOf(t *testing.T, pod *corev1.Pod) uint64 {
	t.Helper()
	var from inject.RestoredFrom
	if err := json.Unmarshal([]byte(pod.Annotations[contract.AnnotationRestoredFrom]), &from); err != nil {
		t.Fatal(err)
	}
	id, err := strconv.ParseUint(from.ReplayStart, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// expectNotRebuilt checks that pod, whose app restarted and whose state
// cannot be rebuilt, is marked with the condition and an Event, its
// sidecar stays stopped, nothing consumes, and no copy is left.
func expectNotRebuilt(t *testing.T, c *simcluster.Cluster, w *workload, pod *corev1.Pod) {
	t.Helper()
	expectEventOn(t, c, w.ns, pod.Name, contract.ReasonStateNotRebuilt, "no longer holds the records")
	var cond *corev1.PodCondition
	testenv.Eventually(t, 30*time.Second, "the pod carries "+contract.ConditionStateNotRebuilt, func() bool {
		p, err := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == contract.ConditionStateNotRebuilt {
				cond = &p.Status.Conditions[i]
			}
		}
		return cond != nil
	})
	if cond.Status != corev1.ConditionTrue || cond.Reason != contract.ConditionReasonRetention {
		t.Errorf("condition %s: %s, reason %s, want True, %s", cond.Type, cond.Status, cond.Reason, contract.ConditionReasonRetention)
	}
	sp := c.Nodes[nodeB].Pod(w.ns, pod.Name)
	if sp == nil || sp.Sidecar.Mode() != simcluster.ModeStopped {
		t.Fatalf("the pod's sidecar is not stopped: it would consume on the checkpoint's state")
	}
	testenv.Eventually(t, 30*time.Second, "the copy is gone", func() bool {
		list, err := c.Client.CoreV1().Pods(w.ns).List(t.Context(), metav1.ListOptions{})
		return err == nil && len(list.Items) == 1 && list.Items[0].UID == pod.UID
	})
	log := c.Log(inject.LogName(pod))
	last := log.LastID()
	if within(time.Second, func() bool { return log.LastID() != last }) {
		t.Errorf("the log grew from %d to %d: something consumes", last, log.LastID())
	}
}
