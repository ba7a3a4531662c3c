// Package agent is the migrator's node agent (`migrator agent`, a
// DaemonSet): the steps of a migration that must run on a node. It has its
// own node's kubelet take the checkpoint (Kubelet: the agent's
// ServiceAccount needs nodes/checkpoint only, so the migrator needs no
// nodes/proxy), builds the OCI checkpoint image from the kubelet's archive
// and pushes it, pulls images through the node's container runtime (CRI),
// hands out the CRIU logs of failed checkpoints, and reports what the
// node's runtime can do (NodeProbe) for the migrator's preflight. Server
// is its HTTP API, served over TLS; Client implements migrate.NodeAgent
// against it.
package agent
