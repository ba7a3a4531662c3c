package webhook

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/testenv"
)

// evictCode asks the API server to evict ns/name (policy/v1, as kubectl
// drain does) and returns the HTTP status and the answer's message.
func evictCode(t *testing.T, cs kubernetes.Interface, ns, name string, dryRun bool) (int, string) {
	t.Helper()
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if dryRun {
		ev.DeleteOptions = &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	}
	body, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var code int
	res := cs.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(name).SubResource("eviction").
		Body(body).SetHeader("Content-Type", "application/json").Do(t.Context()).StatusCode(&code)
	msg := ""
	if err := res.Error(); err != nil {
		msg = err.Error()
	}
	return code, msg
}

// runningPod creates pod on node, as the webhook admits it, and marks it
// Running (no kubelet runs here).
func runningPod(t *testing.T, c client.Client, pod *corev1.Pod, node string) *corev1.Pod {
	t.Helper()
	pod.Spec.NodeName = node
	if err := c.Create(t.Context(), pod); err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	pod.Status.Phase = corev1.PodRunning
	if err := c.Status().Update(t.Context(), pod); err != nil {
		t.Fatalf("mark pod %s Running: %v", pod.Name, err)
	}
	return pod
}

func TestEvictionBecomesMigration(t *testing.T) {
	c := requireSuite(t)
	cs, err := kubernetes.NewForConfig(suite.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns := newNamespace(t, c, nil)
	optedNS := newNamespace(t, c, map[string]string{contract.LabelNamespaceOnEvict: contract.OnEvictMigrate})
	injected := func(ns, name string, more map[string]string) *corev1.Pod {
		a := map[string]string{contract.AnnotationInject: "true"}
		for k, v := range more {
			a[k] = v
		}
		return runningPod(t, c, appPod(ns, name, a), "node-a")
	}
	get := func(ns, name string) *corev1.Pod {
		t.Helper()
		p := &corev1.Pod{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, p); err != nil {
			t.Fatalf("get pod %s: %v", name, err)
		}
		return p
	}
	annotate := func(p *corev1.Pod, k, v string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{k: v}}})
		if err := c.Patch(ctx, p, client.RawPatch(types.MergePatchType, body)); err != nil {
			t.Fatalf("annotate %s: %v", p.Name, err)
		}
	}

	// Opted in by its annotation: refused with 429, marked to evacuate,
	// and refused again while it waits for its migration.
	opted := injected(ns, "opted", map[string]string{contract.AnnotationOnEvict: contract.OnEvictMigrate})
	if _, ok := opted.Annotations[contract.AnnotationStatus]; !ok {
		t.Fatalf("the suite's webhook did not inject pod %s", opted.Name)
	}
	// A dry run is refused too, and marks nothing.
	if code, msg := evictCode(t, cs, ns, "opted", true); code != http.StatusTooManyRequests {
		t.Fatalf("dry-run eviction of an opted-in pod: %d %s, want 429", code, msg)
	}
	if v, ok := get(ns, "opted").Annotations[contract.AnnotationEvacuate]; ok {
		t.Fatalf("a dry-run eviction marked the pod: %s=%s", contract.AnnotationEvacuate, v)
	}
	for i := range 2 {
		code, msg := evictCode(t, cs, ns, "opted", false)
		if code != http.StatusTooManyRequests {
			t.Fatalf("eviction %d of an opted-in pod: %d %s, want 429", i, code, msg)
		}
		for _, want := range []string{"opted", "node-a", contract.AnnotationOnEvict} {
			if !strings.Contains(msg, want) {
				t.Errorf("refusal %q does not name %q", msg, want)
			}
		}
		p := get(ns, "opted")
		if p.DeletionTimestamp != nil {
			t.Fatal("the refused eviction deleted the pod")
		}
		if got := p.Annotations[contract.AnnotationEvacuate]; got != "node-a" {
			t.Fatalf("%s = %q, want node-a", contract.AnnotationEvacuate, got)
		}
	}

	// Its migration runs, then fails: the refusal names it, and why.
	st := map[string]any{"name": "opted-m1", "phase": contract.PhaseRunning, "target": "node-b", "source": "node-a", "evacuation": "node-a", "started": "2026-01-01T00:00:00Z"}
	raw, _ := json.Marshal(st)
	annotate(get(ns, "opted"), contract.AnnotationMigrationStatus, string(raw))
	if code, msg := evictCode(t, cs, ns, "opted", false); code != http.StatusTooManyRequests || !strings.Contains(msg, "opted-m1") || !strings.Contains(msg, "node-b") || !strings.Contains(msg, "Running") {
		t.Errorf("eviction while the migration runs: %d %q, want 429 naming opted-m1, node-b and Running", code, msg)
	}
	st["phase"], st["message"] = contract.PhaseFailed, "checkpoint: the kubelet said no"
	raw, _ = json.Marshal(st)
	annotate(get(ns, "opted"), contract.AnnotationMigrationStatus, string(raw))
	if code, msg := evictCode(t, cs, ns, "opted", false); code != http.StatusTooManyRequests || !strings.Contains(msg, "the kubelet said no") || !strings.Contains(msg, contract.AnnotationOnEvictOverride) {
		t.Errorf("eviction after the migration failed: %d %q, want 429 with the failure and the override", code, msg)
	}

	// The override lets a plain eviction through.
	annotate(get(ns, "opted"), contract.AnnotationOnEvictOverride, "true")
	if code, msg := evictCode(t, cs, ns, "opted", false); code != http.StatusCreated {
		t.Errorf("eviction with %s=true: %d %s, want 201", contract.AnnotationOnEvictOverride, code, msg)
	}

	// Not opted in: evicted.
	injected(ns, "plain", nil)
	if code, msg := evictCode(t, cs, ns, "plain", false); code != http.StatusCreated {
		t.Errorf("eviction of a pod not opted in: %d %s, want 201", code, msg)
	}
	// Opted in without a sidecar (not injected): evicted, nothing could
	// migrate it.
	runningPod(t, c, appPod(ns, "bare", map[string]string{contract.AnnotationOnEvict: contract.OnEvictMigrate}), "node-a")
	if code, msg := evictCode(t, cs, ns, "bare", false); code != http.StatusCreated {
		t.Errorf("eviction of an opted-in pod without the sidecar: %d %s, want 201", code, msg)
	}

	// The namespace's label is the default; the pod's annotation wins.
	injected(optedNS, "by-namespace", nil)
	if code, msg := evictCode(t, cs, optedNS, "by-namespace", false); code != http.StatusTooManyRequests {
		t.Errorf("eviction in a namespace labelled %s=%s: %d %s, want 429", contract.LabelNamespaceOnEvict, contract.OnEvictMigrate, code, msg)
	}
	injected(optedNS, "opted-out", map[string]string{contract.AnnotationOnEvict: contract.OnEvictEvict})
	if code, msg := evictCode(t, cs, optedNS, "opted-out", false); code != http.StatusCreated {
		t.Errorf("eviction of a pod with %s=%s in an opted-in namespace: %d %s, want 201", contract.AnnotationOnEvict, contract.OnEvictEvict, code, msg)
	}

	// A bad value is denied like any bad ms2m annotation.
	bad := appPod(ns, "bad", map[string]string{contract.AnnotationInject: "true", contract.AnnotationOnEvict: "yes"})
	if err := c.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), contract.AnnotationOnEvict) {
		t.Errorf("pod with %s=yes: %v, want a denial naming the annotation", contract.AnnotationOnEvict, err)
	}
}

// TestEvictionOfAStatefulSetPodBackOnTheTarget: kubectl drain evicts by
// name, so once a StatefulSet's pod has left the node being drained and
// come back under its name on the target, drain asks to evict it there.
// While its migration is not recorded as ended, the eviction is refused
// and the pod is not marked (a mark would move it on again, off a node
// nobody drains); once the migration is recorded as Succeeded, evacuated
// off the cordoned node, the answer is "not found" and drain goes on.
func TestEvictionOfAStatefulSetPodBackOnTheTarget(t *testing.T) {
	c := requireSuite(t)
	cs, err := kubernetes.NewForConfig(suite.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns := newNamespace(t, c, nil)
	drained, target := testenv.UniqueName("node-a"), testenv.UniqueName("node-b")
	for _, n := range []struct {
		name     string
		cordoned bool
	}{{drained, true}, {target, false}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: corev1.NodeSpec{Unschedulable: n.cordoned}}
		if err := c.Create(ctx, node); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), node) })
	}
	pod := runningPod(t, c, appPod(ns, "consumer-0", map[string]string{contract.AnnotationInject: "true", contract.AnnotationOnEvict: contract.OnEvictMigrate}), target)
	patch := func(ann map[string]any) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
		if err := c.Patch(ctx, pod, client.RawPatch(types.MergePatchType, body)); err != nil {
			t.Fatalf("annotate %s: %v", pod.Name, err)
		}
	}
	marked := func() string {
		t.Helper()
		p := &corev1.Pod{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: pod.Name}, p); err != nil {
			t.Fatal(err)
		}
		return p.Annotations[contract.AnnotationEvacuate]
	}
	// Restored by migration m1 (its restore record), its migration still
	// running: the status on the pod is the one the source carried, or
	// none yet.
	from, _ := json.Marshal(map[string]string{"migration": "m1"})
	running, _ := json.Marshal(map[string]any{"name": "m1", "phase": contract.PhaseRunning, "source": drained, "target": target, "evacuation": drained, "started": "2026-01-01T00:00:00Z"})
	// As the webhook leaves a restore: its injection status names the
	// migration, the restore annotations are gone.
	var inj map[string]any
	if err := json.Unmarshal([]byte(pod.Annotations[contract.AnnotationStatus]), &inj); err != nil {
		t.Fatalf("the suite's webhook did not inject pod %s: %v", pod.Name, err)
	}
	inj["restore"] = "m1"
	restored, _ := json.Marshal(inj)
	for _, tc := range []struct {
		name string
		ann  map[string]any
	}{
		{"only the injection's status says m1", map[string]any{contract.AnnotationStatus: string(restored)}},
		{"no status yet", map[string]any{contract.AnnotationRestoredFrom: string(from)}},
		{"its migration Running", map[string]any{contract.AnnotationMigrationStatus: string(running)}},
	} {
		patch(tc.ann)
		code, msg := evictCode(t, cs, ns, pod.Name, false)
		if code != http.StatusTooManyRequests || !strings.Contains(msg, "m1") {
			t.Errorf("%s: eviction %d %q, want 429 naming m1", tc.name, code, msg)
		}
		if m := marked(); m != "" {
			t.Fatalf("%s: the pod back on the target was marked %s=%s", tc.name, contract.AnnotationEvacuate, m)
		}
	}
	succeeded, _ := json.Marshal(map[string]any{"name": "m1", "phase": contract.PhaseSucceeded, "source": drained, "target": target, "evacuation": drained, "started": "2026-01-01T00:00:00Z"})
	patch(map[string]any{contract.AnnotationMigrationStatus: string(succeeded)})
	if code, msg := evictCode(t, cs, ns, pod.Name, false); code != http.StatusNotFound {
		t.Errorf("eviction once m1 Succeeded off the cordoned %s: %d %q, want 404", drained, code, msg)
	}
	if m := marked(); m != "" {
		t.Errorf("the pod back on the target was marked %s=%s", contract.AnnotationEvacuate, m)
	}
}
