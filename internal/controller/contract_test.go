package controller

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
)

// The webhook admits a strategy annotation (inject validates it at CREATE
// and at every UPDATE that touches it) exactly when the controller takes
// it as a request: a value the webhook admits but the controller refuses
// is a request that can only fail, and one the webhook denies but the
// controller takes (criu-alone, once) cannot be asked for by annotation.
func TestWebhookAndControllerTakeTheSameStrategies(t *testing.T) {
	cfg := inject.Config{
		SidecarImage: "ms2m/sidecar:test",
		StreamURI:    inject.SecretKey{Name: "ms2m-broker", Key: "stream-uri"},
		ControlToken: inject.SecretKey{Name: "ms2m-control", Key: "token"},
	}
	values := []string{"teleport", "MS2M", "ms2m ", "criu", "statefulset_shadow", "-"}
	for _, s := range contract.Strategies {
		values = append(values, string(s))
	}
	for _, v := range values {
		ann := map[string]string{contract.AnnotationInject: "true", contract.AnnotationMigrateTo: "node-b", contract.AnnotationStrategy: v}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: "shop", Annotations: ann},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "consumer:1"}}},
		}
		_, err := inject.Inject(inject.Input{Pod: pod}, cfg)
		var deny *inject.DenyError
		if err != nil && !errors.As(err, &deny) {
			t.Fatalf("strategy %q: inject: %v", v, err)
		}
		webhook := err == nil
		_, err = parseRequest(pod)
		controller := err == nil
		if webhook != controller {
			t.Errorf("strategy %q: the webhook admits it: %v (%v), the controller takes it: %v (%v)", v, webhook, deny, controller, err)
		}
		if want := contract.Strategy(v).Valid(); controller != want {
			t.Errorf("strategy %q: the controller takes it: %v, contract.Strategies has it: %v", v, controller, want)
		}
	}
}
