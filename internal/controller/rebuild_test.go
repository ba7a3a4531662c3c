package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// TestRebuildFirst: a request on a pod waits while this process rebuilds
// it, or while its app restarted and it is not yet rebuilt (a restarted
// controller's rebuild goes on first); not for a pod whose state cannot
// be rebuilt, nor for one that does not run (the request is refused).
func TestRebuildFirst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pod   func(*corev1.Pod)
		held  any // the pod's podKey in running, if set
		waits bool
	}{
		{name: "app restarted", waits: true},
		{name: "restart already dealt with", pod: func(p *corev1.Pod) { p.Status.ContainerStatuses[0].RestartCount = 0 }},
		{name: "rebuilt here", pod: func(p *corev1.Pod) { p.Status.ContainerStatuses[0].RestartCount = 0 }, held: "rebuild", waits: true},
		{name: "migrated here", pod: func(p *corev1.Pod) { p.Status.ContainerStatuses[0].RestartCount = 0 }, held: "migration"},
		{name: "records gone", pod: func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: contract.ConditionStateNotRebuilt, Status: corev1.ConditionTrue, Reason: contract.ConditionReasonRetention}}
		}},
		{name: "rebuild failed, retried", pod: func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: contract.ConditionStateNotRebuilt, Status: corev1.ConditionTrue, Reason: contract.ConditionReasonFailed}}
		}, waits: true},
		{name: "not running", pod: func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := restartedPod()
			if tc.pod != nil {
				tc.pod(pod)
			}
			r := New(Config{})
			if tc.held != nil {
				r.running.Store(podKey(pod.Namespace, pod.Name), tc.held)
			}
			if got := r.rebuildFirst(pod); (got != "") != tc.waits {
				t.Errorf("rebuildFirst = %q, want waits %v", got, tc.waits)
			}
		})
	}
}
