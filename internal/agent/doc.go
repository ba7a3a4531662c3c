// Package agent is the migrator's node agent (`migrator agent`, a
// DaemonSet): the steps of a migration that must run on a node. It builds
// the OCI checkpoint image from a kubelet checkpoint archive and pushes it,
// pulls images through the node's container runtime (CRI), hands out the
// CRIU logs of failed checkpoints, and reports what the node's runtime can
// do (NodeProbe) for the migrator's preflight. Server is its HTTP API;
// Client implements migrate.NodeAgent against it.
package agent
