//go:build tools

// Package tools pins the Kubernetes binaries built from this module. Nothing
// imports it; the build tag keeps it out of every ordinary build.
//
//   - kube-apiserver and etcd: the test control plane of the envtest suites
//     (`make k8s-bin`).
//   - kubelet, kube-proxy, kube-controller-manager and kube-scheduler: the
//     rest of a real node and control plane, for checkpoint and restore
//     through the kubelet and for Service routing (`make node-bin`).
//   - kubectl: the real `kubectl drain` of the e2e drain test (`make node-bin`).
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
