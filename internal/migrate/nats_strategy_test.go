package migrate

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
)

// TestNATSStrategy: a pod whose sidecar is a NATS one migrates by every
// strategy but criu-alone, which is refused with a message that says
// which one to use. An AMQP pod is not affected.
func TestNATSStrategy(t *testing.T) {
	pod := func(broker string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-1"}, Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: inject.SidecarName, Env: []corev1.EnvVar{{Name: "MS2M_BROKER", Value: broker}}}},
		}}
	}
	for _, s := range contract.Strategies {
		err := natsStrategy(pod("nats"), s)
		switch {
		case s != contract.StrategyCRIUAlone && err != nil:
			t.Errorf("strategy %s refused for a NATS pod: %v", s, err)
		case s == contract.StrategyCRIUAlone && (err == nil || !strings.Contains(err.Error(), "set annotation ms2m.io/strategy to ms2m")):
			t.Errorf("strategy %s for a NATS pod: err = %v, want a refusal that names ms2m", s, err)
		}
		if err := natsStrategy(pod("amqp"), s); err != nil {
			t.Errorf("strategy %s refused for an AMQP pod: %v", s, err)
		}
	}
}
