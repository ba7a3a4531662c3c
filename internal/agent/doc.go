// Package agent is the migrator's node agent (`migrator agent`, a
// DaemonSet): the steps of a migration that must run on a node. It builds
// the OCI checkpoint image from a kubelet checkpoint archive and pushes it,
// pulls images through the node's container runtime (CRI), and hands out
// the CRIU logs of failed checkpoints. Server is its HTTP API; Client
// implements migrate.NodeAgent against it.
package agent
