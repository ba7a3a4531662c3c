// Package simcluster is a Kubernetes cluster for the migrator's
// integration tests: a real kube-apiserver and etcd (envtest), the real
// kube-controller-manager (ReplicaSet, Deployment and StatefulSet
// controllers), the real ms2m webhook and an in-process image registry,
// with simulated nodes.
//
// A simulated node is what the migrator talks to on a node, on an address
// in a network namespace the cluster created (the API server refuses to
// proxy to loopback): a kubelet that answers the checkpoint API with a real
// archive file, the real `migrator agent` server that builds and pushes the
// checkpoint image from it, and, for each pod bound to the node, a sidecar
// control API on the pod's own address. The pods' sidecars and apps are
// models (Sidecar, App): deliveries, quiesce, stop at a cutoff, replay from
// a checkpoint ID up to a cutoff, and an app state that goes into the
// checkpoint archive and comes back out of the restored image, so that a
// test sees every delivery processed exactly once or the gap or duplicate
// that broke it. A pod with several app containers (a whole pod) runs an
// app model for each, each on a queue of its own through the one sidecar
// (SimPod.Apps), checkpointed and restored each from its own image. Failures and holds can be armed per step, to fail a
// checkpoint (Node.FailCheckpointOf: one container's), a restore or a
// push (Cluster.FailPushesOf: one tag's), or to kill the migrator in a
// phase.
//
// Nothing here is the evidence that a sidecar or a checkpoint works (the
// e2e suite runs the real ones on real nodes); it is the evidence that the
// migrator drives them right: the API calls in order, the pods it makes,
// the images it pushes, and what it leaves behind when it fails or dies.
package simcluster
