// Package e2e holds the end-to-end tests: real migrations of unmodified
// consumers between the real nodes of a local cluster (package cluster:
// kubelet, containerd, runc and CRIU in network namespaces), with the
// sidecar, the replay log on the real broker, and the kubelet checkpoint
// API. The tests bring the cluster up themselves and take it down. With
// MS2M_E2E_RUNTIME=crio the nodes run CRI-O instead of containerd, and with
// a list, one per node (crio,crio,containerd), each node its own.
package e2e
