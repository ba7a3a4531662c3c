package controller

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ms2m/ms2m/internal/brokeruser"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestControllerProvisionsBrokerUsers runs the broker-users reconciler in a
// controller-runtime manager against a real kube-apiserver and the real
// RabbitMQ management API: namespaces in scope get their user and Secret,
// others do not, a namespace being deleted loses its user, and the user of
// a namespace deleted while no controller ran is swept at start.
func TestControllerProvisionsBrokerUsers(t *testing.T) {
	m := testenv.RequireManagement(t)
	b := testenv.RequireBroker(t)
	cfg := testenv.ControlPlane(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(b.StreamURI)
	addr, err := brokeruser.ParseStreamAddress("rabbitmq-stream://" + u.Host + "/")
	if err != nil {
		t.Fatal(err)
	}
	mgmt := &brokeruser.Management{URL: m.URL, Username: m.Username, Password: m.Password}
	prov := &brokeruser.Provisioner{Management: mgmt, Secrets: cs.CoreV1(), Stream: addr, UserPrefix: testenv.UniqueName("ms2m-test") + "."}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	t.Cleanup(cancel)

	// A user ms2m made for a namespace that no longer exists.
	stale := testenv.UniqueName("stale")
	if err := mgmt.PutUser(ctx, prov.UserName(stale), "stale-password-of-a-gone-namespace", []string{contract.BrokerUserTag}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgmt.DeleteUser(context.WithoutCancel(t.Context()), prov.UserName(stale)) })

	mkNS := func(name string, labels map[string]string) {
		t.Helper()
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = prov.Remove(context.WithoutCancel(t.Context()), name, false) })
	}
	labelled, byPod, bystander := testenv.UniqueName("labelled"), testenv.UniqueName("bypod"), testenv.UniqueName("bystander")
	mkNS(labelled, map[string]string{contract.LabelNamespaceInject: "enabled"})
	mkNS(bystander, nil)
	mkNS(byPod, nil)
	if _, err := cs.CoreV1().Pods(bystander).Create(ctx, testPod("plain", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	mgr, err := manager.New(cfg, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	rec := &BrokerUsers{Provisioner: prov, Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Exclude: []string{"kube-system"}, Log: logr.Discard()}
	if err := rec.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	provisioned := func(ns string) bool {
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, contract.BrokerUserSecret, metav1.GetOptions{})
		if err != nil {
			return false
		}
		p, err := mgmt.GetPermissions(ctx, "/", prov.UserName(ns))
		return err == nil && p == brokeruser.PermissionsFor(ns) && len(s.Data[contract.BrokerUserSecretStreamURI]) > 0
	}
	testenv.Eventually(t, 30*time.Second, "the labelled namespace provisioned", func() bool { return provisioned(labelled) })
	testenv.Eventually(t, 30*time.Second, "the stale user swept", func() bool {
		_, err := mgmt.GetUser(ctx, prov.UserName(stale))
		return errors.Is(err, brokeruser.ErrNotFound)
	})

	// A pod that opts in, in a namespace that did not: its namespace gets
	// its user, so that the pod's sidecar can start.
	if _, err := cs.CoreV1().Pods(byPod).Create(ctx, testPod("optin", map[string]string{contract.AnnotationInject: "true"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the opted-in pod's namespace provisioned", func() bool { return provisioned(byPod) })
	// The bystander, reconciled at the start with the others, has nothing.
	if _, err := cs.CoreV1().Secrets(bystander).Get(ctx, contract.BrokerUserSecret, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a namespace without ms2m got a broker user Secret (%v)", err)
	}
	if _, err := mgmt.GetUser(ctx, prov.UserName(bystander)); !errors.Is(err, brokeruser.ErrNotFound) {
		t.Errorf("a namespace without ms2m got a broker user (%v)", err)
	}

	// A namespace being deleted loses its user (the control plane has no
	// namespace controller: the namespace stays terminating, which is the
	// moment the reconciler acts on).
	if err := cs.CoreV1().Namespaces().Delete(ctx, labelled, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the deleted namespace's user removed", func() bool {
		_, err := mgmt.GetUser(ctx, prov.UserName(labelled))
		return errors.Is(err, brokeruser.ErrNotFound)
	})
	if !provisioned(byPod) {
		t.Error("the other namespace's user went too")
	}
}

func testPod(name string, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.test/app:1"}}},
	}
}
