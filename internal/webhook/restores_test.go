package webhook

import (
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
)

// suiteKey is the controller's signing key as the suite's webhook has it.
var suiteKey = []byte("webhook-suite-signing-key-0123")

// restoreAnnotations are the restore annotations of migration m for pod
// ns/pod, signed as the controller signs them with key, valid until exp.
func restoreAnnotations(key []byte, ns, pod string, m inject.Migration, exp time.Time) map[string]string {
	return map[string]string{
		contract.AnnotationRestoreImage: m.Image, contract.AnnotationRestoreNode: m.Node,
		contract.AnnotationReplayStart: m.ReplayStart, contract.AnnotationReplayCutoff: m.ReplayCutoff,
		contract.AnnotationLogName: m.LogName, contract.AnnotationMigrationName: m.Name,
		contract.AnnotationRestoreSignature: inject.SignRestore(key, ns, pod, m, exp),
	}
}

// TestDeniesRestoreNotOrderedByTheController is issue 20's attack on
// checkpoints, as a tenant that may create pods and ConfigMaps in its own
// namespace performs it against the real API server: it makes a pod of its
// own a restore of a checkpoint (another namespace's, whose memory it wants
// to run or read), by restore annotations or a pending-migration
// ConfigMap, unsigned, with a signature of its own making, with one the
// controller made for another namespace's pod or for another pod, with the
// image changed after signing, or after the signature expired. On 58fa1c0
// every one of these was restored (the image was checked only for spaces).
// Each is denied now, with a message naming where the instruction came
// from and why; the controller's own instruction is restored.
func TestDeniesRestoreNotOrderedByTheController(t *testing.T) {
	c := requireSuite(t)
	t.Parallel()
	ctx := t.Context()
	tenant, victim := newNamespace(t, c, nil), newNamespace(t, c, nil)
	later := time.Now().Add(time.Hour)
	// The victim's migration, as the controller signed it for its target.
	theirs := inject.Migration{Name: "orders-x1", Image: "registry.test/ms2m/checkpoints/" + victim + "/orders@sha256:9c8d", Node: "node-b",
		LogName: inject.DefaultLogName(tenant, "orders"), ReplayStart: "0", ReplayCutoff: "marker", ReplayEpoch: "0"}
	restorePod := func(name string, ann map[string]string) *corev1.Pod {
		return appPod(tenant, name, ann)
	}

	t.Run("unsigned annotations", func(t *testing.T) {
		ann := restoreAnnotations(suiteKey, tenant, "a1", theirs, later)
		delete(ann, contract.AnnotationRestoreSignature)
		requireDenied(t, c.Create(ctx, restorePod("a1", ann)), contract.AnnotationRestoreImage, "has no signature", "only ms2m's controller can order a restore")
	})
	t.Run("signature of the tenant's making", func(t *testing.T) {
		ann := restoreAnnotations([]byte("the-tenants-own-key-0123456789"), tenant, "a2", theirs, later)
		requireDenied(t, c.Create(ctx, restorePod("a2", ann)), contract.AnnotationRestoreImage, "signature does not match")
	})
	t.Run("copied from another namespace's pod", func(t *testing.T) {
		ann := restoreAnnotations(suiteKey, victim, "a3", theirs, later)
		requireDenied(t, c.Create(ctx, restorePod("a3", ann)), contract.AnnotationRestoreImage, "signature does not match", "another pod or namespace than "+tenant+"/a3")
	})
	t.Run("copied from another pod", func(t *testing.T) {
		ann := restoreAnnotations(suiteKey, tenant, "orders-m1", theirs, later)
		requireDenied(t, c.Create(ctx, restorePod("a4", ann)), contract.AnnotationRestoreImage, "signature does not match")
	})
	t.Run("image changed after signing", func(t *testing.T) {
		own := theirs
		own.Image = "registry.test/ms2m/checkpoints/" + tenant + "/orders@sha256:1111"
		ann := restoreAnnotations(suiteKey, tenant, "a5", own, later)
		ann[contract.AnnotationRestoreImage] = theirs.Image
		requireDenied(t, c.Create(ctx, restorePod("a5", ann)), contract.AnnotationRestoreImage, "signature does not match")
	})
	t.Run("expired", func(t *testing.T) {
		ann := restoreAnnotations(suiteKey, tenant, "a6", theirs, time.Now().Add(-time.Second))
		requireDenied(t, c.Create(ctx, restorePod("a6", ann)), contract.AnnotationRestoreImage, "signature expired at")
	})

	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "web",
		UID: types.UID("2c1e5c3a-7f2d-4c1b-9a9e-6f1c2d3e4f52"), Controller: new(true)}
	pending := func(pod string, m inject.Migration) {
		t.Helper()
		data, _ := json.Marshal(m)
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: contract.PendingConfigMapName(pod)},
			Data:       map[string]string{contract.PendingConfigMapKey: string(data)},
		}
		if err := c.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	stsPod := func(name string) *corev1.Pod {
		p := appPod(tenant, name, map[string]string{contract.AnnotationInject: "true"})
		p.OwnerReferences = []metav1.OwnerReference{owner}
		return p
	}
	t.Run("unsigned pending-migration ConfigMap", func(t *testing.T) {
		pending("web-0", theirs)
		requireDenied(t, c.Create(ctx, stsPod("web-0")), contract.PendingConfigMapName("web-0"), "has no signature", "delete the ConfigMap")
	})
	t.Run("pending migration copied from another namespace", func(t *testing.T) {
		m := theirs
		m.Signature = inject.SignRestore(suiteKey, victim, "web-1", m, later)
		pending("web-1", m)
		requireDenied(t, c.Create(ctx, stsPod("web-1")), contract.PendingConfigMapName("web-1"), "signature does not match")
	})
	t.Run("the controller's own", func(t *testing.T) {
		own := theirs
		own.Image = "registry.test/ms2m/checkpoints/" + tenant + "/orders@sha256:2222"
		pod := restorePod("a7", restoreAnnotations(suiteKey, tenant, "a7", own, later))
		if err := c.Create(ctx, pod); err != nil {
			t.Fatalf("the controller's signed restore was denied: %v", err)
		}
		requireRestore(t, pod, requireInjected(t, pod), own.Image, own.Node, own.ReplayStart, own.ReplayCutoff, own.LogName, own.Name)
	})
}
