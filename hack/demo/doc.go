// Command demo is `make demo`: two real migrations of an unmodified
// stateful consumer between the nodes of a local Kubernetes cluster, one
// with ms2m and one with stop-and-copy, while a producer keeps sending.
//
// It brings up the local cluster of real nodes (e2e/cluster, through
// e2e/lab) in its own state folder, starts the sample Go consumer behind
// the sidecar on node 1, feeds it with the sample producer, and moves it to
// node 2 with migrate.Run, printing each phase as it ends. When the
// producer is done it reads the restored consumer's hash chain and compares
// it with the producer's: equal means every message was processed exactly
// once, in order, across the migration. It prints a table of both
// migrations (total time, downtime, checkpoint ID, cutoff, hashes) and
// ms2m's downtime as a share of stop-and-copy's, deletes the queues and
// replay logs it made, and takes the cluster down, on failure and on
// Ctrl-C too, unless -keep is given. It exits non-zero when a migration
// failed or a hash does not match.
package main
