package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/migratorcli"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestAnnotationTriggersMigration: with the controller running, annotating
// an injected pod with ms2m.io/migrate-to moves it. A request for a node
// that does not exist is refused first, with a Warning Event and a status
// that says why, and nothing touched.
func TestAnnotationTriggersMigration(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withControllerAndAgents)

	name := testenv.UniqueName("ann")
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	prod := produce(t, src, name, 10, 150, 20)

	// Bad input: a node that does not exist.
	annotate(t, ctx, l, name, map[string]any{contract.AnnotationMigrateTo: "no-such-node"})
	testenv.Eventually(t, 30*time.Second, "the request for a missing node is refused", func() bool {
		p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil && migrationStatus(t, p).Phase == contract.PhaseFailed
	})
	p, _ := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, name, metav1.GetOptions{})
	if st := migrationStatus(t, p); !strings.Contains(st.Message, "no-such-node") || !strings.Contains(st.Message, "nothing was touched") {
		t.Errorf("status of the refused request: %+v", st)
	}
	waitEvent(t, ctx, l, src, contract.ReasonMigrationRejected)

	// The real request.
	annotate(t, ctx, l, name, map[string]any{contract.AnnotationMigrationStatus: nil, contract.AnnotationMigrateTo: l.NodeName(2)})
	target, st := waitMigrated(t, ctx, l, name, src)
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name, target.Name) })
	t.Logf("migration %s: %s; phases %+v", st.Name, st.Message, st.Report.Phases)
	if target.Spec.NodeName != l.NodeName(2) || st.Report == nil || st.Report.Downtime <= 0 || len(st.Report.Phases) < 5 {
		t.Errorf("target %s on %s with status %+v", target.Name, target.Spec.NodeName, st)
	}
	if _, ok := target.Annotations[contract.AnnotationMigrateTo]; ok {
		t.Error("the target carries the migration request too")
	}
	waitEvent(t, ctx, l, target, contract.ReasonMigrationSucceeded)
	expectExact(t, ctx, prod, target)
}

// TestControllerRollsBackWhatAKilledOneLeft: a migration recorded as
// Running that no controller drives (the one that started it was killed
// after quiescing the source and creating the target) is rolled back by
// the next controller: the target goes, the source serves again, and the
// consumer's hash is exact. On the suite's own cluster the next controller
// starts once the scene is set; on an external one it is the installed
// controller, which finds the scene when the status lands.
func TestControllerRollsBackWhatAKilledOneLeft(t *testing.T) {
	l := needCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	name := testenv.UniqueName("killed")
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	prod := produce(t, src, name, 10, 100, 10)

	// What a controller killed mid-migration leaves: the source quiesced,
	// a target pod, and a Running status.
	port, token, err := migrateSidecar(ctx, l, src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replayQuiesce(ctx, src, port, token); err != nil {
		t.Fatal(err)
	}
	half := name + "-half"
	decoy, err := l.Pod(lab.Consumer{Name: half, Queue: name + "-none", Node: l.NodeName(2), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	if !l.WebhookRunning() {
		decoy = mustAdmit(t, l, decoy)
	}
	if _, err := l.Client.CoreV1().Pods(lab.Namespace).Create(ctx, decoy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name, half) })
	st := controller.Status{Name: half, Phase: contract.PhaseRunning, Strategy: "ms2m", Target: l.NodeName(2), TargetPod: half, Started: time.Now()}
	// Signed as the controller signs it: it trusts no other record.
	key := signingKey(t, ctx, l)
	ann := controller.SignedAnnotations(key, lab.Namespace, st)
	ann[contract.AnnotationMigrateTo] = l.NodeName(2)
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	patch := string(b)
	if _, err := l.Client.CoreV1().Pods(lab.Namespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if !l.External {
		if mode := sidecarMode(t, src); mode != "quiesced" {
			t.Fatalf("source sidecar %q before the new controller starts, want quiesced", mode)
		}
		// A new controller starts.
		startController(t, ctx, l, l.Agent())
	}

	testenv.Eventually(t, time.Minute, "the migration is rolled back", func() bool {
		p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil && migrationStatus(t, p).Phase == contract.PhaseRolledBack
	})
	waitEvent(t, ctx, l, src, contract.ReasonMigrationRolledBack)
	if mode := sidecarMode(t, src); mode != "serving" {
		t.Errorf("source sidecar %q after the rollback, want serving", mode)
	}
	testenv.Eventually(t, time.Minute, "the half-made target is gone", func() bool {
		_, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, half, metav1.GetOptions{})
		return err != nil
	})
	expectExact(t, ctx, prod, src)
}

func migrateSidecar(ctx context.Context, l *lab.Lab, p *corev1.Pod) (int, string, error) {
	return migrate.SidecarGiven(ctx, l.Client, p)
}

func replayQuiesce(ctx context.Context, p *corev1.Pod, port int, token string) (control.Cut, error) {
	c := control.ClientAt(p.Status.PodIP, port, token, &http.Client{Timeout: 30 * time.Second})
	return c.Quiesce(ctx, 20*time.Second)
}

func mustAdmit(t *testing.T, l *lab.Lab, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	a, err := l.Admit(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// externalStatusKey is the status key of the controller installed on an
// external cluster: the chart's, in its Secret wherever the release is;
// with no such Secret, the lab's own key, which `hack/cluster up
// --with-ms2m` gives the controller it runs as a host process
// (lab.Install). A wrong key fails the test at the status's signature.
func externalStatusKey(t *testing.T, ctx context.Context, l *lab.Lab) []byte {
	t.Helper()
	list, err := l.Client.CoreV1().Secrets("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + migratorcli.StatusKeySecret})
	switch {
	case err != nil || len(list.Items) > 1:
		t.Fatalf("the chart controller's status key (Secret %s): %v, %d found", migratorcli.StatusKeySecret, err, len(list.Items))
	case len(list.Items) == 0:
		t.Logf("no Secret %s: the controller is taken to be up --with-ms2m's host process, with the lab's key", migratorcli.StatusKeySecret)
		return []byte(lab.SigningKey)
	}
	return list.Items[0].Data[migratorcli.StatusKeySecretKey]
}
