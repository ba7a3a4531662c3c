package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ms2m/ms2m/internal/brokeruser"
	"github.com/ms2m/ms2m/internal/contract"
)

// BrokerUsers gives every namespace in scope its own broker user
// (brokeruser.Provisioner.Ensure), again every Resync so that a user or
// Secret removed by hand comes back, and deletes the user of a namespace
// that is being deleted or gone.
//
// In scope: the namespaces listed in Namespaces; when none are listed,
// every namespace labelled ms2m.io/inject=enabled or holding a pod that
// opted in (annotation or label ms2m.io/inject=true) or carries the
// sidecar (ms2m.io/status), except those in Exclude. A pod created before
// its namespace's Secret exists waits for it (its sidecar cannot start
// without it) and starts once it is written.
type BrokerUsers struct {
	Provisioner *brokeruser.Provisioner
	// Reader reads namespaces and pods (the manager's cache); APIReader
	// reads past it (the manager's API reader): a user is removed only
	// when the API server itself says its namespace is gone or going.
	Reader     client.Reader
	APIReader  client.Reader
	Namespaces []string
	Exclude    []string
	// Resync is how often a namespace is provisioned again. Default 10m.
	Resync time.Duration
	Log    logr.Logger
}

// SetupWithManager registers the reconciler, and a sweep at the leader's
// start that deletes the users of namespaces deleted while no controller
// ran.
func (b *BrokerUsers) SetupWithManager(mgr ctrl.Manager) error {
	if b.Resync == 0 {
		b.Resync = 10 * time.Minute
	}
	toNamespace := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
	})
	err := ctrl.NewControllerManagedBy(mgr).
		Named("broker-users").
		For(&corev1.Namespace{}).
		Watches(&corev1.Pod{}, toNamespace, builder.WithPredicates(predicate.NewPredicateFuncs(podWantsSidecar))).
		Complete(b)
	if err != nil {
		return err
	}
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if err := b.sweep(ctx); err != nil {
			b.Log.Error(err, "broker users: the sweep of deleted namespaces' users failed; it runs again at the next leader's start")
		}
		return nil
	}))
}

// podWantsSidecar: the pod opted in, or carries the sidecar.
func podWantsSidecar(o client.Object) bool {
	a, l := o.GetAnnotations(), o.GetLabels()
	_, injected := a[contract.AnnotationStatus]
	return injected || a[contract.AnnotationInject] == "true" || l[contract.LabelInject] == "true"
}

// Reconcile provisions, or removes, one namespace's broker user.
func (b *BrokerUsers) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ns := req.Name
	log := b.Log.WithValues("namespace", ns)
	var n corev1.Namespace
	err := b.Reader.Get(ctx, types.NamespacedName{Name: ns}, &n)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if apierrors.IsNotFound(err) || n.DeletionTimestamp != nil {
		if gone, err := b.gone(ctx, ns); err != nil || !gone {
			return reconcile.Result{}, err
		}
		// The Secret goes with the namespace; the broker user would not.
		if err := b.Provisioner.Remove(ctx, ns, false); err != nil {
			return reconcile.Result{}, fmt.Errorf("remove the broker user of deleted namespace %s: %w", ns, err)
		}
		log.V(1).Info("broker user removed with its namespace")
		return reconcile.Result{}, nil
	}
	in, err := b.inScope(ctx, &n)
	if err != nil || !in {
		return reconcile.Result{}, err
	}
	res, err := b.Provisioner.Ensure(ctx, ns)
	if err != nil {
		var notOurs *brokeruser.NotOursError
		if errors.As(err, &notOurs) {
			log.Error(err, "broker user not provisioned")
			return reconcile.Result{RequeueAfter: b.Resync}, nil
		}
		return reconcile.Result{}, fmt.Errorf("provision the broker user of namespace %s: %w", ns, err)
	}
	if res.SecretWritten {
		log.Info("broker user provisioned", "user", res.User, "secret", contract.BrokerUserSecret, "newPassword", res.NewPassword)
	}
	return reconcile.Result{RequeueAfter: b.Resync}, nil
}

func (b *BrokerUsers) inScope(ctx context.Context, n *corev1.Namespace) (bool, error) {
	if len(b.Namespaces) > 0 {
		return slices.Contains(b.Namespaces, n.Name), nil
	}
	if slices.Contains(b.Exclude, n.Name) {
		return false, nil
	}
	if n.Labels[contract.LabelNamespaceInject] == "enabled" {
		return true, nil
	}
	var pods corev1.PodList
	if err := b.Reader.List(ctx, &pods, client.InNamespace(n.Name)); err != nil {
		return false, err
	}
	for i := range pods.Items {
		if podWantsSidecar(&pods.Items[i]) {
			return true, nil
		}
	}
	return false, nil
}

// sweep removes the users ms2m made for namespaces that no longer exist.
func (b *BrokerUsers) sweep(ctx context.Context) error {
	names, err := b.Provisioner.Namespaces(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range names {
		gone, err := b.gone(ctx, ns)
		switch {
		case err != nil:
			errs = append(errs, err)
		case gone:
			if err := b.Provisioner.Remove(ctx, ns, false); err != nil {
				errs = append(errs, err)
			} else {
				b.Log.Info("broker user of a deleted namespace removed", "namespace", ns)
			}
		}
	}
	return errors.Join(errs...)
}

// gone asks the API server whether namespace ns is gone or being deleted.
func (b *BrokerUsers) gone(ctx context.Context, ns string) (bool, error) {
	var n corev1.Namespace
	err := b.APIReader.Get(ctx, types.NamespacedName{Name: ns}, &n)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up namespace %s: %w", ns, err)
	}
	return n.DeletionTimestamp != nil, nil
}
