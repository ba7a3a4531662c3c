//go:build tools

// Package tools pins the control-plane binaries that `make k8s-bin` builds
// for the envtest integration tests. Nothing imports it; the build tag keeps
// it out of every ordinary build.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
