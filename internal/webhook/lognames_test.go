package webhook

import (
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	corev1 "k8s.io/api/core/v1"
)

// TestDeniesAnotherNamespacesLog is issue 20's attack on replay logs, as a
// tenant with the rights to create pods and ConfigMaps in its own
// namespace performs it against the real API server: a pod in namespace A
// names the replay log of a pod in namespace B, by annotation, as a restore
// target, or through a pending-migration ConfigMap, to read B's messages
// into its own app or to write into B's log. On 58fa1c0 all three were
// admitted and the sidecar got MS2M_LOG_NAME=<B's log>. Each is denied now,
// with a message naming the annotation (or field), the prefix it lacks and
// what to use.
func TestDeniesAnotherNamespacesLog(t *testing.T) {
	c := requireSuite(t)
	t.Parallel()
	ctx := t.Context()
	nsA, nsB := newNamespace(t, c, nil), newNamespace(t, c, nil)

	// B's pod, with its default log "<B>.orders-0".
	victim := appPod(nsB, "orders-0", map[string]string{contract.AnnotationInject: "true"})
	if err := c.Create(ctx, victim); err != nil {
		t.Fatalf("create B's pod: %v", err)
	}
	if got := envValue(requireInjected(t, victim), "MS2M_LOG_NAME"); got != "$(POD_NAMESPACE).$(POD_NAME)" {
		t.Fatalf("B's sidecar has MS2M_LOG_NAME=%q, want the default $(POD_NAMESPACE).$(POD_NAME)", got)
	}
	bLog := inject.LogName(victim)
	if bLog != inject.DefaultLogName(nsB, "orders-0") {
		t.Fatalf("B's log is %q, want %q", bLog, inject.DefaultLogName(nsB, "orders-0"))
	}
	wantSaid := []string{contract.AnnotationLogName, bLog, `must start with "` + nsA + `."`, `use "` + nsA + `.orders-0"`}

	t.Run("annotation", func(t *testing.T) {
		pod := appPod(nsA, "reader", map[string]string{contract.AnnotationInject: "true", contract.AnnotationLogName: bLog})
		requireDenied(t, c.Create(ctx, pod), wantSaid...)
	})
	t.Run("restore annotations", func(t *testing.T) {
		pod := appPod(nsA, "restore", map[string]string{
			contract.AnnotationRestoreImage: "registry.test/checkpoints/consumer:ckpt-7", contract.AnnotationRestoreNode: "node-b",
			contract.AnnotationReplayStart: "0", contract.AnnotationReplayCutoff: "marker",
			contract.AnnotationLogName: bLog, contract.AnnotationMigrationName: "mig-1",
		})
		requireDenied(t, c.Create(ctx, pod), wantSaid...)
	})
	t.Run("annotation added by update", func(t *testing.T) {
		pod := appPod(nsA, "updated", map[string]string{contract.AnnotationInject: "true"})
		if err := c.Create(ctx, pod); err != nil {
			t.Fatalf("create: %v", err)
		}
		pod.Annotations[contract.AnnotationLogName] = bLog
		requireDenied(t, c.Update(ctx, pod), wantSaid...)
	})
	t.Run("pending-migration ConfigMap", func(t *testing.T) {
		m, _ := json.Marshal(inject.Migration{Name: "mig-2", Image: "registry.test/checkpoints/web-0:ckpt-3", Node: "node-c",
			LogName: bLog, ReplayStart: "0", ReplayCutoff: "marker"})
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: nsA, Name: contract.PendingConfigMapName("web-0")},
			Data:       map[string]string{contract.PendingConfigMapKey: string(m)},
		}
		if err := c.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
		pod := appPod(nsA, "web-0", map[string]string{contract.AnnotationInject: "true"})
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "web",
			UID: types.UID("6a1e5c3a-7f2d-4c1b-9a9e-6f1c2d3e4f51"), Controller: new(true)}}
		requireDenied(t, c.Create(ctx, pod), "logName", bLog, `must start with "`+nsA+`."`)
	})
	t.Run("sidecar written in by the tenant", func(t *testing.T) {
		// A copy of B's injected pod, sidecar and status included, so that
		// the webhook would skip it as already injected, with B's log.
		pod := victim.DeepCopy()
		pod.ObjectMeta = metav1.ObjectMeta{Namespace: nsA, Name: "copied", Annotations: victim.Annotations}
		pod.Spec.NodeName = ""
		for i := range pod.Spec.InitContainers {
			for j, e := range pod.Spec.InitContainers[i].Env {
				if e.Name == "MS2M_LOG_NAME" {
					pod.Spec.InitContainers[i].Env[j].Value = bLog
				}
			}
		}
		requireDenied(t, c.Create(ctx, pod), "MS2M_LOG_NAME", bLog, `must start with "`+nsA+`."`)
	})
	t.Run("own namespace", func(t *testing.T) {
		pod := appPod(nsA, "own", map[string]string{contract.AnnotationInject: "true", contract.AnnotationLogName: inject.DefaultLogName(nsA, "orders")})
		if err := c.Create(ctx, pod); err != nil {
			t.Fatalf("a log name of the pod's own namespace was denied: %v", err)
		}
		if got := inject.LogName(pod); got != inject.DefaultLogName(nsA, "orders") {
			t.Errorf("sidecar log = %q, want %q", got, inject.DefaultLogName(nsA, "orders"))
		}
	})
}
