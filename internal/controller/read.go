package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The controller reads pods and its pending-migration records through the
// manager's cache (Config.Reader) where a read that lags the API server is
// safe: a reconcile's first look (the cache holds the event that queued
// it), whose outcome is guarded (a write with the resourceVersion read, a
// create that finds the object there) or looked at again. It reads from
// the API server (freshPod) where a decision rests on what this controller
// or a migration wrote moments ago, which a cache may not hold yet: the
// status of a migration that just ended, whether a target took over, the
// pod a StatefulSet just made again under the same name. Each such call
// says why. Nodes and PodDisruptionBudgets are read from the API server
// too: they are not cached (the controller may only get nodes).

// cachedPod reads pod ns/name from the manager's cache (from the API
// server without one).
func (r *Reconciler) cachedPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	if r.cfg.Reader == nil {
		return r.freshPod(ctx, ns, name)
	}
	var pod corev1.Pod
	if err := r.cfg.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &pod); err != nil {
		return nil, err
	}
	return &pod, nil
}

// freshPod reads pod ns/name from the API server, past the cache: its
// caller says why it cannot act on a read that lags.
func (r *Reconciler) freshPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return r.cfg.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

// cachedConfigMap reads ConfigMap ns/name from the manager's cache (from
// the API server without one); the cache holds only the pending-migration
// records.
func (r *Reconciler) cachedConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	if r.cfg.Reader == nil {
		return r.cfg.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	}
	var cm corev1.ConfigMap
	if err := r.cfg.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &cm); err != nil {
		return nil, err
	}
	return &cm, nil
}
