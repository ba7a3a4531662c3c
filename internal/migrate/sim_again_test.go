package migrate_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/testenv"
)

// Migrate again and again: a pod that the controller moved (or whose
// request it refused) moves on as easily as the first time, by setting
// ms2m.io/migrate-to again.

// TestMigrateAgainByAnnotation drives one Deployment's pod through the
// controller: a typo refused, the corrected request carried out (with a
// request for a third node refused while it runs), the same node refused,
// and back to the first node; each migration exact, each answer an Event.
func TestMigrateAgainByAnnotation(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	w := deploy(t, c, "sim-again", "Deployment", true)
	startController(t, c, "the controller", c.Kubeconfig)
	pods := c.Client.CoreV1().Pods(w.ns)
	ctx := t.Context()
	ask := func(pod, node string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, contract.AnnotationMigrateTo, node)
		if _, err := pods.Patch(ctx, pod, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("ask %s to migrate to %s: %v", pod, node, err)
		}
	}

	// A typo: refused, and the request is answered.
	ask(w.pod.Name, "sim-nowhere")
	st := waitAnswered(t, c, w.ns, w.pod.Name, "")
	if st.Phase != contract.PhaseFailed || !strings.Contains(st.Message, "sim-nowhere") {
		t.Errorf("the typo's status: %s %q, want Failed naming the node", st.Phase, st.Message)
	}
	expectEventOn(t, c, w.ns, w.pod.Name, contract.ReasonMigrationRejected, "sim-nowhere")

	// Corrected: it migrates. While it runs (its restore held on node B),
	// a request for another node is refused with an Event.
	hold := c.Nodes[nodeB].HoldStep(simcluster.StepRestore)
	ask(w.pod.Name, nodeB)
	select {
	case <-hold.Reached:
	case <-time.After(time.Minute):
		hold.Release()
		t.Fatal("the corrected request did not start a migration")
	}
	ask(w.pod.Name, nodeA)
	expectEventOn(t, c, w.ns, w.pod.Name, contract.ReasonMigrationInProgress, "under way")
	hold.Release()
	first := waitMigrated(t, c, w.ns, w.pod, nodeB, "")

	// The same node: refused with an Event, nothing touched.
	ask(first.Name, nodeB)
	st = waitAnswered(t, c, w.ns, first.Name, first.Annotations[contract.AnnotationMigrationStatus])
	if st.Phase != contract.PhaseFailed || !strings.Contains(st.Message, "already runs on "+nodeB) {
		t.Errorf("the same-node request's status: %s %q", st.Phase, st.Message)
	}
	expectEventOn(t, c, w.ns, first.Name, contract.ReasonMigrationRejected, "already runs on "+nodeB)
	if got, err := pods.Get(ctx, first.Name, metav1.GetOptions{}); err != nil || got.UID != first.UID {
		t.Fatalf("the pod on %s after the same-node request: %v", nodeB, err)
	}

	// And back: A → B → A.
	ask(first.Name, nodeA)
	second := waitMigrated(t, c, w.ns, first, nodeA, st.Name)
	st, _ = controller.DecodeStatus(second.Annotations[contract.AnnotationMigrationStatus])
	var hist []string
	for _, e := range st.History {
		hist = append(hist, fmt.Sprintf("%s %s→%s", e.Outcome, e.From, e.To))
	}
	want := []string{"Succeeded sim-b→sim-a", "Failed sim-b→sim-b", "Succeeded sim-a→sim-b", "Failed sim-a→sim-nowhere"}
	if !slices.Equal(hist, want) {
		t.Errorf("history on the pod back on %s: %v, want %v", nodeA, hist, want)
	}
	// Names do not grow: each pod is named as its ReplicaSet names pods.
	rs := metav1.GetControllerOf(w.pod).Name
	for _, p := range []*corev1.Pod{first, second} {
		if !regexp.MustCompile(`^` + regexp.QuoteMeta(rs) + `-[a-z0-9]{5}$`).MatchString(p.Name) {
			t.Errorf("pod name %s is not of its ReplicaSet %s's form <rs>-<5 characters>", p.Name, rs)
		}
	}
}

// waitAnswered waits until pod's request is answered (its migrate-to is
// gone) with a status other than was, and returns that status.
func waitAnswered(t *testing.T, c *simcluster.Cluster, ns, pod, was string) controller.Status {
	t.Helper()
	var st controller.Status
	testenv.Eventually(t, 30*time.Second, "the request on "+pod+" is answered", func() bool {
		p, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), pod, metav1.GetOptions{})
		if err != nil {
			return false
		}
		v := p.Annotations[contract.AnnotationMigrationStatus]
		if _, asked := p.Annotations[contract.AnnotationMigrateTo]; asked || v == "" || v == was {
			return false
		}
		st, err = controller.DecodeStatus(v)
		return err == nil && st.Phase != contract.PhaseRunning
	})
	return st
}

// waitMigrated waits until the workload's pod that replaced src runs on
// node with a Succeeded status (of a migration other than prev), serves,
// and has processed every delivery once; it returns that pod.
func waitMigrated(t *testing.T, c *simcluster.Cluster, ns string, src *corev1.Pod, node, prev string) *corev1.Pod {
	t.Helper()
	ctx := t.Context()
	var got *corev1.Pod
	testenv.Eventually(t, 90*time.Second, "the pod is migrated to "+node, func() bool {
		list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 {
			return false // the source goes once the target serves
		}
		p := &list.Items[0]
		st, err := controller.DecodeStatus(p.Annotations[contract.AnnotationMigrationStatus])
		if err != nil || p.UID == src.UID || p.Spec.NodeName != node || st.Phase != contract.PhaseSucceeded || st.Name == prev || p.Status.Phase != corev1.PodRunning {
			return false
		}
		got = p
		return true
	})
	sp := c.Nodes[node].Pod(ns, got.Name)
	if sp == nil || sp.UID != got.UID || !sp.Restored {
		t.Fatalf("node %s does not run %s restored from a checkpoint", node, got.Name)
	}
	before := sp.App.State().Last
	testenv.Eventually(t, 10*time.Second, got.Name+" processes new deliveries", func() bool { return sp.App.State().Last > before+3 })
	if st := sp.App.State(); len(st.Violations) > 0 || st.Count != st.Last {
		t.Errorf("%s's app processed %d deliveries, the last %d, out of order %v: want each once, in order", got.Name, st.Count, st.Last, st.Violations)
	}
	if ctrl := metav1.GetControllerOf(got); ctrl == nil || ctrl.Kind != "ReplicaSet" {
		t.Errorf("%s's controller is %v, want the ReplicaSet", got.Name, ctrl)
	}
	if _, ok := got.Annotations[contract.AnnotationMigrateTo]; ok {
		t.Errorf("%s carries a migration request", got.Name)
	}
	// Serving, it reads as an ordinary pod of its workload: the restore
	// annotations are gone, and what it was restored from is recorded.
	st, _ := controller.DecodeStatus(got.Annotations[contract.AnnotationMigrationStatus])
	testenv.Eventually(t, 10*time.Second, got.Name+"'s restore annotations are replaced", func() bool {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, got.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		got = p
		return p.Annotations[contract.AnnotationRestoredFrom] != ""
	})
	for _, k := range inject.RestoreRequestAnnotations {
		if v, ok := got.Annotations[k]; ok {
			t.Errorf("%s still carries %s=%s while it serves", got.Name, k, v)
		}
	}
	var from inject.RestoredFrom
	if err := json.Unmarshal([]byte(got.Annotations[contract.AnnotationRestoredFrom]), &from); err != nil || from.Migration != st.Name || from.Image != got.Spec.Containers[0].Image || from.ReplayStart == "" {
		t.Errorf("%s's %s = %s (%v), want migration %s from its app's image", got.Name, contract.AnnotationRestoredFrom, got.Annotations[contract.AnnotationRestoredFrom], err, st.Name)
	}
	if st.Report == nil || len(st.Report.Warnings) > 0 {
		t.Errorf("%s's migration report: %+v, want one without warnings", got.Name, st.Report)
	}
	return got
}

// expectEventOn waits for an Event of reason about pod whose note says
// what.
func expectEventOn(t *testing.T, c *simcluster.Cluster, ns, pod, reason, what string) {
	t.Helper()
	var seen []string
	ok := within(20*time.Second, func() bool {
		evs, err := c.Client.EventsV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			if e.Regarding.Name != pod {
				continue
			}
			if e.Reason == reason && strings.Contains(e.Note, what) {
				return true
			}
			seen = append(seen, e.Reason+": "+e.Note)
		}
		return false
	})
	if !ok {
		t.Errorf("no Event %s about %s saying %q; seen: %q", reason, pod, what, seen)
	}
}

// within polls cond until it holds or d passes, and says whether it held.
func within(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}
