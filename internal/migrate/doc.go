// Package migrate holds the steps of a migration that talk to the
// Kubernetes API: the kubelet checkpoint call through the API server's node
// proxy, the target pod made from the source, and waiting for pods. Each
// step is small and separately testable; the migrator strings them
// together per strategy, and the end-to-end tests drive them directly.
// A pod's app containers move together: each is checkpointed under the one
// hold of the sidecar and restored from a checkpoint image of its own.
package migrate
