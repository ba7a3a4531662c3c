// Package lab is what the end-to-end tests, `make demo` and the benchmarks
// put on a local cluster (package cluster): the images of the sidecar and
// the sample consumers pushed to the cluster's registry, the Secret the
// injected sidecars read, consumer pods admitted as the webhook would admit
// them, the sample producer, and a node agent that does the migrator's
// node-local steps from the host.
package lab
