package migrate_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
		owner     string
		strategy  contract.Strategy
		retention bool
	}{
		{"Deployment, rebuilt", "Deployment", contract.StrategyMS2M, false},
		{"Deployment, the log's records are gone", "Deployment", contract.StrategyMS2M, true},
		{"StatefulSet, rebuilt", "StatefulSet", contract.StrategyStatefulSetShadow, false},
		{"StatefulSet, the log's records are gone", "StatefulSet", contract.StrategyStatefulSetShadow, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(c)
			defer resetNodes(c)
			w := deploy(t, c, "sim-app-restart-"+suffix(), tc.owner, true)
			t.Cleanup(func() { scaleToZero(t, c, w) })
			startController(t, c, "the controller", c.Kubeconfig)
			requestMigration(t, c, w, tc.strategy)
			served := waitServed(t, c, w)
			log := c.Log(inject.LogName(served))
			if tc.retention {
				log.DropThrough(checkpointOf(t, served) + 1)
			}
			restartServedApp(t, c, served)
			expectEventOn(t, c, w.ns, served.Name, contract.ReasonAppRestarted, "came back from the checkpoint")
			if tc.retention {
				expectNotRebuilt(t, c, w, served)
				return
			}
			expectEventOn(t, c, w.ns, served.Name, contract.ReasonStateRebuilt, "the state was rebuilt")
			name, owner := migrate.RebuildPodName(served), "ReplicaSet"
			if tc.owner == "StatefulSet" {
				name, owner = served.Name, "StatefulSet"
			}
			var got *corev1.Pod
			if !within(time.Minute, func() bool {
				list, err := c.Client.CoreV1().Pods(w.ns).List(t.Context(), metav1.ListOptions{})
				if err != nil || len(list.Items) != 1 || list.Items[0].Name != name || list.Items[0].UID == served.UID {
					return false
				}
				got = &list.Items[0]
				ctrl := metav1.GetControllerOf(got)
				return ctrl != nil && ctrl.Kind == owner && got.Annotations[contract.AnnotationRestoredFrom] != ""
			}) {
				st := c.Nodes[nodeB].Pod(w.ns, served.Name).App.State()
				t.Fatalf("no new restore %s alone serves after a minute; the restarted pod's app processed %d, the last %d, out of order: %v", name, st.Count, st.Last, st.Violations)
			}
			if got.Spec.NodeName != nodeB {
				t.Errorf("the new restore runs on %s, want %s (where the checkpoint image is)", got.Spec.NodeName, nodeB)
			}
			sp := c.Nodes[nodeB].Pod(w.ns, name)
			if sp == nil || sp.UID != got.UID || !sp.Restored {
				t.Fatalf("node %s does not run the new restore %s from the checkpoint", nodeB, name)
			}
			before := sp.App.State().Last
			testenv.Eventually(t, 10*time.Second, "the new restore processes new deliveries", func() bool { return sp.App.State().Last > before+3 })
			st := sp.App.State()
			if len(st.Violations) > 0 {
				t.Errorf("the new restore's app saw deliveries out of order: %v", st.Violations)
			}
			if last := log.LastID(); st.Count != st.Last || st.Last+1 < last {
				t.Errorf("the new restore's app processed %d deliveries, the last %d; the log holds %d: want each of them once", st.Count, st.Last, last)
			}
			for _, p := range w.created.all()[1:] {
				if !strings.Contains(p.Annotations[contract.AnnotationStatus], `"restore"`) {
					t.Errorf("pod %s was created without a restore: it would start with empty state", p.Name)
				}
			}
			if _, err := c.Client.CoreV1().ConfigMaps(w.ns).Get(t.Context(), contract.PendingConfigMapName(served.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("a pending-migration ConfigMap is left (err %v)", err)
			}
		})
	}
}

// waitServed waits until the workload's migration has ended Succeeded
// with its restored pod alone serving on node B, and returns that pod.
func waitServed(t *testing.T, c *simcluster.Cluster, w *workload) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	testenv.Eventually(t, 90*time.Second, "the restored pod alone serves on "+nodeB, func() bool {
		list, err := c.Client.CoreV1().Pods(w.ns).List(t.Context(), metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 {
			return false
		}
		p := &list.Items[0]
		if p.UID == w.pod.UID || p.Spec.NodeName != nodeB || p.Annotations[contract.AnnotationRestoredFrom] == "" {
			return false
		}
		sp := c.Nodes[nodeB].Pod(w.ns, p.Name)
		if sp == nil || sp.UID != p.UID || sp.Sidecar.Mode() != simcluster.ModeServing {
			return false
		}
		got = p
		return true
	})
	testenv.Eventually(t, 30*time.Second, "the migration's pending-migration ConfigMap goes", func() bool {
		_, err := c.Client.CoreV1().ConfigMaps(w.ns).Get(t.Context(), contract.PendingConfigMapName(got.Name), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	sp := c.Nodes[nodeB].Pod(w.ns, got.Name)
	before := sp.App.State().Last
	testenv.Eventually(t, 10*time.Second, got.Name+" processes new deliveries", func() bool { return sp.App.State().Last > before+3 })
	if st := sp.App.State(); len(st.Violations) > 0 || st.Count != sp.App.WantCount(st.Last) {
		t.Fatalf("%s's app processed %d deliveries, the last %d, out of order %v before the fault", got.Name, st.Count, st.Last, st.Violations)
	}
	return got
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
	// A Deployment's pod stays, stopped, and its copy goes; a
	// StatefulSet's pod was made again as the restore, whose replay failed
	// before it consumed anything, and its pending-migration record stays
	// so that it never starts empty.
	sp := c.Nodes[nodeB].Pod(w.ns, pod.Name)
	if w.owner == "StatefulSet" {
		st := sp.Sidecar.State()
		if sp.UID == pod.UID || st.Mode != simcluster.ModeReplaying || st.Source == nil || !strings.Contains(st.Source.Error, "no longer holds") {
			t.Fatalf("the StatefulSet's pod made again does not refuse its replay: mode %s, source %+v", st.Mode, st.Source)
		}
		if _, err := c.Client.CoreV1().ConfigMaps(w.ns).Get(t.Context(), contract.PendingConfigMapName(pod.Name), metav1.GetOptions{}); err != nil {
			t.Errorf("the pending-migration ConfigMap: %v, want it kept", err)
		}
	} else {
		if sp == nil || sp.UID != pod.UID || sp.Sidecar.Mode() != simcluster.ModeStopped {
			t.Fatalf("the pod's sidecar is not stopped: it would consume on the checkpoint's state")
		}
		testenv.Eventually(t, 30*time.Second, "the copy is gone", func() bool {
			list, err := c.Client.CoreV1().Pods(w.ns).List(t.Context(), metav1.ListOptions{})
			return err == nil && len(list.Items) == 1 && list.Items[0].UID == pod.UID
		})
	}
	log := c.Log(inject.LogName(pod))
	last := log.LastID()
	if within(time.Second, func() bool { return log.LastID() != last }) {
		t.Errorf("the log grew from %d to %d: something consumes", last, log.LastID())
	}
}

// scaleToZero ends the workload's pods once the test is done (after its
// controller): the simulated cluster runs no namespace controller, so a
// deleted namespace's pods would keep their addresses, of which the
// simulated nodes have a few dozen for the whole suite.
func scaleToZero(t *testing.T, c *simcluster.Cluster, w *workload) {
	ctx := context.WithoutCancel(t.Context())
	patch := []byte(`{"spec":{"replicas":0}}`)
	var err error
	if w.owner == "StatefulSet" {
		_, err = c.Client.AppsV1().StatefulSets(w.ns).Patch(ctx, "consumer", types.MergePatchType, patch, metav1.PatchOptions{})
	} else {
		_, err = c.Client.AppsV1().Deployments(w.ns).Patch(ctx, "consumer", types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		t.Logf("scale %s to 0: %v", w.owner, err)
	}
	if err := c.Client.CoreV1().Pods(w.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Logf("delete the pods of %s: %v", w.ns, err)
	}
	if !within(30*time.Second, func() bool {
		l, err := c.Client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	}) {
		t.Logf("pods of %s are left", w.ns)
	}
}
