package webhook

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestWebhookDownStopsOnlyOptedInPods registers the configuration that the
// chart installs (Registration) for a webhook that is down — its address
// refuses connections — and creates pods with the real API server, as
// tenants of other namespaces would: their pods are created; only a pod
// that opted in by a label, its namespace's or its own, is refused, and
// no UPDATE is blocked. With one Fail webhook for every namespace (58fa1c0)
// the API server refuses every pod of the cluster.
func TestWebhookDownStopsOnlyOptedInPods(t *testing.T) {
	c := requireSuite(t)
	ctx := t.Context()
	name := testenv.UniqueName("ms2m-down")
	// Only this test's namespaces (skipLabel=name) go to this webhook, and
	// none to the suite's.
	plain := newNamespace(t, c, map[string]string{skipLabel: name})
	optedIn := newNamespace(t, c, map[string]string{skipLabel: name, contract.LabelNamespaceInject: "enabled"})
	existing := appPod(optedIn, "existing", map[string]string{contract.AnnotationInject: "false"})
	if err := c.Create(ctx, existing); err != nil {
		t.Fatal(err)
	}

	url := "https://" + testenv.FreeAddr(t) + Path // nothing listens there
	mwc := Registration{
		Name:              name,
		ClientConfig:      admissionregistrationv1.WebhookClientConfig{URL: &url},
		ExcludeNamespaces: []string{"kube-system"},
		NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{skipLabel: name}},
	}.Configuration()
	if err := c.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(t.Context()), mwc) })

	create := func(pod *corev1.Pod, opts ...client.CreateOption) error { return c.Create(ctx, pod, opts...) }
	refused := func(err error) bool { return err != nil && strings.Contains(err.Error(), "failed calling webhook") }
	// The API server loads the configuration in the background: wait
	// until a pod of the opted-in namespace is refused.
	testenv.Eventually(t, 30*time.Second, "the API server to call the webhook that is down", func() bool {
		return refused(create(appPod(optedIn, testenv.UniqueName("probe"), nil), client.DryRunAll))
	})

	for _, tc := range []struct {
		name        string
		pod         *corev1.Pod
		wantRefused bool
	}{
		{"a pod of a namespace that did not opt in", appPod(plain, "bystander", nil), false},
		{"a pod opted in by annotation only", appPod(plain, "annotated", map[string]string{contract.AnnotationInject: "true"}), false},
		{"a pod labelled ms2m.io/inject=false in an opted-in namespace", withLabels(appPod(optedIn, "opted-out", nil), map[string]string{contract.LabelInject: "false"}), false},
		{"a pod of a namespace labelled ms2m.io/inject=enabled", appPod(optedIn, "consumer", nil), true},
		{"a pod labelled ms2m.io/inject=true", withLabels(appPod(plain, "labelled", map[string]string{contract.AnnotationInject: "true"}), map[string]string{contract.LabelInject: "true"}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := create(tc.pod)
			switch {
			case tc.wantRefused && !refused(err):
				t.Errorf("create: %v; want it refused while the webhook is down (the pod opted in to fail closed)", err)
			case !tc.wantRefused && err != nil:
				t.Errorf("create: %v; want it created while the webhook is down", err)
			}
		})
	}

	t.Run("an update in an opted-in namespace", func(t *testing.T) {
		existing.Annotations[contract.AnnotationMigrateTo] = "node-b"
		existing.Labels = map[string]string{"touched": "yes"}
		if err := c.Update(ctx, existing); err != nil {
			t.Errorf("update: %v; want it admitted while the webhook is down", err)
		}
	})
}

func withLabels(p *corev1.Pod, l map[string]string) *corev1.Pod {
	p.Labels = l
	return p
}
