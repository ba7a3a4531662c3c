// Command pause is the pod sandbox process: the first process of every pod,
// which holds the pod's namespaces open while the app containers come and
// go. It waits for SIGTERM or SIGINT and exits 0. When it runs as PID 1 of a
// PID namespace (a pod with shareProcessNamespace), it also reaps the
// zombies that orphaned processes leave behind. It is built static and
// tagged registry.k8s.io/pause:3.10, the sandbox image containerd pins, so a
// node without registry access has one.
package main
