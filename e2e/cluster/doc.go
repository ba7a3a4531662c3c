// Package cluster brings up a local Kubernetes cluster of real nodes on this
// machine, for end-to-end tests and demos of checkpoint and restore: etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler on the host, and
// per node a containerd or a CRI-O (with CRIU through runc; Options.Runtime,
// one runtime for all nodes or one per node) and a kubelet, each node in
// a network namespace of its own that hangs off a host bridge. A detached
// helper on the host serves an image registry and forwards the broker's
// loopback ports to the bridge, so pods can reach both. Up is idempotent,
// Down removes everything Up made and nothing else, and all state lives
// under one folder. hack/cluster is the command-line front end;
// docs/local-cluster.md describes the layout and addresses.
package cluster
