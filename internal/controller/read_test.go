package controller

import (
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	ctrlfake "sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
)

// TestRebuildActsOnAFreshRead: the rebuild reconciler's first look is the
// cache's, but it acts only on what the API server holds. A cache that
// still shows the app restarted after the pod was marked as not
// rebuildable (its records are gone) starts no rebuild and says nothing.
// The fakes stand for the cache and the API server, which disagree; the
// rebuild itself is tested on the simulated cluster
// (TestAppRestartAfterTheMigration).
func TestRebuildActsOnAFreshRead(t *testing.T) {
	stale := restartedPod()
	now := stale.DeepCopy()
	now.Status.Conditions = append(now.Status.Conditions, corev1.PodCondition{
		Type: contract.ConditionStateNotRebuilt, Status: corev1.ConditionTrue, Reason: contract.ConditionReasonRetention})
	ev := &recorder{}
	m, _ := newTestMetrics(t)
	r := New(Config{
		Client: fake.NewClientset(now), Reader: ctrlfake.NewClientBuilder().WithObjects(stale).Build(),
		Events: ev, StatusKey: []byte("0123456789abcdef0123456789abcdef"), Metrics: m,
	})
	res, err := r.reconcileRebuild(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: stale.Namespace, Name: stale.Name}})
	if err != nil || res != (reconcile.Result{}) {
		t.Errorf("= %+v, %v; want nothing to do", res, err)
	}
	if got := ev.got(); len(got) != 0 {
		t.Errorf("Events %v; want none: the API server says the pod was marked already", got)
	}
}

// restartedPod is a restored pod that serves and whose app container
// restarted since it took over.
func restartedPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "consumer-0", UID: "u1",
			Annotations: map[string]string{contract.AnnotationRestoredFrom: `{"migration":"m1","appRestarts":0}`}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: inject.SidecarName, Ports: []corev1.ContainerPort{{Name: inject.ControlPortName, ContainerPort: 1}}}},
			Containers:     []corev1.Container{{Name: "app"}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", RestartCount: 1}}},
	}
}

// recorder keeps the reasons of the Events it is given.
type recorder struct {
	mu      sync.Mutex
	reasons []string
}

func (r *recorder) Eventf(_ runtime.Object, _ runtime.Object, _, reason, _, _ string, _ ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reasons = append(r.reasons, reason)
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reasons...)
}
