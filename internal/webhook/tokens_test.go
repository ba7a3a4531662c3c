package webhook

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
)

// TestControlTokensPerNamespace: the webhook writes each namespace's own
// control token (control.TokenFor with the controller's key) into the
// Secret its sidecars read before it admits an injected pod, through the
// real API server. Tenants of two namespaces read two different tokens,
// neither of which opens the other's sidecars (TestControlTokenOfAnother-
// NamespaceRefused in internal/sidecar calls them). A value an operator
// set alike in every namespace, as the chart's secrets.controlToken.value
// did, is replaced, and the Secret's other keys are kept. A dry run writes
// nothing.
func TestControlTokensPerNamespace(t *testing.T) {
	c := requireSuite(t)
	t.Parallel()
	ctx := t.Context()
	a, b, shared := newNamespace(t, c, nil), newNamespace(t, c, nil), newNamespace(t, c, nil)
	ref := testInject.ControlToken
	old := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: shared, Name: ref.Name},
		Data: map[string][]byte{ref.Key: []byte("one-token-for-every-namespace"), "stream-uri": []byte("rabbitmq-stream://u:p@broker:5552/")}}
	if err := c.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	dry := newNamespace(t, c, nil)
	if err := c.Create(ctx, appPod(dry, "consumer", map[string]string{contract.AnnotationInject: "true"}), client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	for _, ns := range []string{a, b, shared} {
		if err := c.Create(ctx, appPod(ns, "consumer", map[string]string{contract.AnnotationInject: "true"})); err != nil {
			t.Fatalf("create an injected pod in %s: %v", ns, err)
		}
		// What a tenant of ns can read: its own namespace's Secret.
		s := &corev1.Secret{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, s); err != nil {
			t.Fatalf("namespace %s: the control-token Secret: %v", ns, err)
		}
		tokens[ns] = string(s.Data[ref.Key])
		if want := control.TokenFor(suiteKey, ns); tokens[ns] != want {
			t.Errorf("namespace %s: control token %q, want its own %q", ns, tokens[ns], want)
		}
		if ns == shared && string(s.Data["stream-uri"]) != string(old.Data["stream-uri"]) {
			t.Errorf("namespace %s: the Secret's other key became %q; want it kept", ns, s.Data["stream-uri"])
		}
	}
	if tokens[a] == tokens[b] || tokens[a] == tokens[shared] || tokens[b] == tokens[shared] {
		t.Errorf("two namespaces share a control token: %v", tokens)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: dry, Name: ref.Name}, &corev1.Secret{}); err == nil {
		t.Errorf("a dry run wrote namespace %s's control token", dry)
	}
}
