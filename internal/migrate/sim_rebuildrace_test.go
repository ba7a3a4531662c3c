package migrate_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/simcluster"
)

// TestRequestDuringARebuildWaits: a Deployment's pod, migrated to node B
// and serving, has its app container restarted; while the controller
// rebuilds its state (the copy's restore held on node B), the pod is
// asked to migrate back to node A. The request waits, with an Event
// saying why, and nothing of the migration starts; once the copy serves
// with the rebuilt state, the request is carried over to it and the copy
// migrates to node A, every delivery processed once. On the code before,
// the request started a migration of the pod whose sidecar the rebuild
// had stopped and whose app held the checkpoint's state, beside the
// rebuild that was about to replace it.
func TestRequestDuringARebuildWaits(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	w := deploy(t, c, "sim-rebuild-race-"+suffix(), "Deployment", true)
	t.Cleanup(func() { scaleToZero(t, c, w) })
	startController(t, c, "the controller", c.Kubeconfig)
	requestMigration(t, c, w, contract.StrategyMS2M)
	served := waitServed(t, c, w)

	hold := c.Nodes[nodeB].HoldStep(simcluster.StepRestore)
	defer hold.Release()
	restartServedApp(t, c, served)
	select {
	case <-hold.Reached:
	case <-time.After(time.Minute):
		t.Fatal("the rebuild did not restore a copy")
	}
	expectEventOn(t, c, w.ns, served.Name, contract.ReasonAppRestarted, "came back from the checkpoint")

	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, contract.AnnotationMigrateTo, nodeA, contract.AnnotationStrategy, contract.StrategyMS2M)
	if _, err := c.Client.CoreV1().Pods(w.ns).Patch(t.Context(), served.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	expectEventOn(t, c, w.ns, served.Name, contract.ReasonMigrationWaiting, "waiting for the rebuild")
	// Held, the rebuild cannot end: nothing of the migration may start.
	if within(3*time.Second, func() bool { return len(eventsOn(t, c, w.ns, served.Name, contract.ReasonMigrationStarted)) > 0 }) {
		t.Fatalf("a migration of %s started while its state was rebuilt: %q", served.Name, eventsOn(t, c, w.ns, served.Name, contract.ReasonMigrationStarted))
	}
	if sp := c.Nodes[nodeB].Pod(w.ns, served.Name); sp == nil || sp.Sidecar.Mode() != simcluster.ModeStopped {
		t.Fatalf("%s's sidecar is not stopped by the rebuild", served.Name)
	}
	hold.Release()

	copyName := migrate.RebuildPodName(served)
	expectEventOn(t, c, w.ns, served.Name, contract.ReasonStateRebuilt, "the state was rebuilt")
	expectEventOn(t, c, w.ns, copyName, contract.ReasonMigrationWaiting, "carried over")
	copyPod, err := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), copyName, metav1.GetOptions{})
	if err != nil {
		copyPod = served // gone already: migrated; waitMigrated checks the rest
	}
	moved := waitMigrated(t, c, w.ns, copyPod, nodeA, "")
	if moved.UID == served.UID {
		t.Fatalf("%s was migrated, not the copy that rebuilt its state", served.Name)
	}
	if got := eventsOn(t, c, w.ns, served.Name, contract.ReasonMigrationStarted); len(got) > 0 {
		t.Errorf("a migration of the restarted pod %s started: %q", served.Name, got)
	}
	if got := eventsOn(t, c, w.ns, copyName, contract.ReasonMigrationStarted); len(got) != 1 {
		t.Errorf("migrations of the rebuilt copy %s: %q, want the one request's", copyName, got)
	}
}

// eventsOn lists the notes of the Events with reason about pod.
func eventsOn(t *testing.T, c *simcluster.Cluster, ns, pod, reason string) []string {
	t.Helper()
	evs, err := c.Client.EventsV1().Events(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.Regarding.Name == pod && e.Reason == reason {
			out = append(out, strings.TrimSpace(e.Note))
		}
	}
	return out
}
