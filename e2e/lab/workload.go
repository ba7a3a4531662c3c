package lab

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
)

// Kind is the controller a consumer runs under.
type Kind string

const (
	// Deployment runs the consumer as a Deployment of one replica: its
	// ReplicaSet owns the pod.
	Deployment Kind = "Deployment"
	// StatefulSet runs it as a StatefulSet of one replica: pod <name>-0.
	StatefulSet Kind = "StatefulSet"
)

// StartWorkload creates a Deployment or a StatefulSet (kind) named c.Name,
// of one replica, whose template is c's pod as a user writes it (opted in
// by annotation; the webhook must run to inject it), and waits until its
// pod runs. DeleteWorkload removes it.
func (l *Lab) StartWorkload(ctx context.Context, kind Kind, c Consumer) (*corev1.Pod, error) {
	p, err := l.Pod(c)
	if err != nil {
		return nil, err
	}
	if !l.WebhookRunning() {
		return nil, fmt.Errorf("%s %s: the webhook must run to inject the pods its controller makes (StartWebhook)", kind, c.Name)
	}
	one := int32(1)
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: p.Labels, Annotations: p.Annotations}, Spec: p.Spec}
	sel := &metav1.LabelSelector{MatchLabels: p.Labels}
	meta := metav1.ObjectMeta{Name: c.Name, Namespace: Namespace}
	apps := l.Client.AppsV1()
	switch kind {
	case Deployment:
		_, err = apps.Deployments(Namespace).Create(ctx, &appsv1.Deployment{ObjectMeta: meta,
			Spec: appsv1.DeploymentSpec{Replicas: &one, Template: tmpl, Selector: sel}}, metav1.CreateOptions{})
	case StatefulSet:
		_, err = apps.StatefulSets(Namespace).Create(ctx, &appsv1.StatefulSet{ObjectMeta: meta,
			Spec: appsv1.StatefulSetSpec{Replicas: &one, ServiceName: c.Name, Template: tmpl, Selector: sel}}, metav1.CreateOptions{})
	default:
		return nil, fmt.Errorf("workload %s: kind %q, want %s or %s", c.Name, kind, Deployment, StatefulSet)
	}
	if err != nil {
		return nil, fmt.Errorf("create %s %s: %w", kind, c.Name, err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pods, err := l.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + c.Name})
		if err == nil && len(pods.Items) > 0 {
			return migrate.WaitRunning(ctx, l.Client, Namespace, pods.Items[0].Name, time.Until(deadline))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s %s made no pod within 2m (%v)", kind, c.Name, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// DeleteWorkload deletes the Deployment or StatefulSet name, every pod
// labelled app=name (the migration's targets and shadows too), and a
// StatefulSet pod's pending-migration ConfigMap, and waits until the pods
// are gone.
func (l *Lab) DeleteWorkload(ctx context.Context, kind Kind, name string) error {
	bg := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{PropagationPolicy: &bg}
	apps := l.Client.AppsV1()
	var err error
	switch kind {
	case Deployment:
		err = apps.Deployments(Namespace).Delete(ctx, name, opts)
	case StatefulSet:
		err = apps.StatefulSets(Namespace).Delete(ctx, name, opts)
		if err == nil || apierrors.IsNotFound(err) {
			err = l.Client.CoreV1().ConfigMaps(Namespace).Delete(ctx, contract.PendingConfigMapName(name+"-0"), metav1.DeleteOptions{})
		}
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s: %w", kind, name, err)
	}
	pods, err := l.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		return fmt.Errorf("delete the pods of %s %s: %w", kind, name, err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	return l.DeletePods(ctx, names...)
}
