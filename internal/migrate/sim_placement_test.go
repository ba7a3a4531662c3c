package migrate_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/internal/contract"
)

// TestMigrateToTaintedNodeRefused performs the confused-deputy attack of
// issue 20 as a tenant would: the tenant annotates its own pod with
// ms2m.io/migrate-to naming a node tainted for another team. The
// controller, which pins the target past the scheduler, must refuse it
// with a Warning Event that names the node, the taint and the override,
// and touch nothing; with ms2m.io/migrate-force: "true" it migrates.
// Before the placement check the first request migrated onto the tainted
// node.
func TestMigrateToTaintedNodeRefused(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	ctx := t.Context()
	nodes := c.Client.CoreV1().Nodes()
	taint := func(spec string) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"taints":%s}}`, spec)
		if _, err := nodes.Patch(ctx, nodeB, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("taint %s: %v", nodeB, err)
		}
	}
	taint(`[{"key":"dedicated","value":"team-b","effect":"NoSchedule"}]`)
	t.Cleanup(func() {
		if _, err := nodes.Patch(context.WithoutCancel(t.Context()), nodeB, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
			t.Logf("untaint %s: %v", nodeB, err)
		}
	})
	w := deploy(t, c, "sim-tainted", "Deployment", true)
	startController(t, c, "the controller", c.Kubeconfig)
	pods := c.Client.CoreV1().Pods(w.ns)

	ask := func(extra string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q%s}}}`, contract.AnnotationMigrateTo, nodeB, extra)
		if _, err := pods.Patch(ctx, w.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("ask %s to migrate to %s: %v", w.pod.Name, nodeB, err)
		}
	}

	ask("")
	st := waitAnswered(t, c, w.ns, w.pod.Name, "")
	for _, part := range []string{"target node " + nodeB, "taint dedicated=team-b:NoSchedule", contract.AnnotationMigrateForce, "nothing was touched"} {
		if st.Phase != contract.PhaseFailed || !strings.Contains(st.Message, part) {
			t.Errorf("the status of the request for the tainted node: %s %q, want Failed saying %q", st.Phase, st.Message, part)
		}
	}
	expectEventOn(t, c, w.ns, w.pod.Name, contract.ReasonMigrationTargetNotAllowed, "taint dedicated=team-b:NoSchedule")
	expectEventOn(t, c, w.ns, w.pod.Name, contract.ReasonMigrationTargetNotAllowed, contract.AnnotationMigrateForce+`: "true"`)
	expectServing(t, c, w)
	if got := w.created.names(); len(got) != 1 {
		t.Fatalf("%d pods were created, want only the source: %v", len(got), got)
	}

	// The override: the same request migrates, and the override goes with
	// the answer (it holds for one request).
	ask(fmt.Sprintf(`,%q:"true"`, contract.AnnotationMigrateForce))
	got := waitMigrated(t, c, w.ns, w.pod, nodeB, "") // a new pod: the refused request may have had the same name (names go by the second)
	if v, ok := got.Annotations[contract.AnnotationMigrateForce]; ok {
		t.Errorf("the migrated pod %s carries %s=%s: the override must not outlive its request", got.Name, contract.AnnotationMigrateForce, v)
	}
}
