// Command demo is `make demo`: six real migrations of an unmodified
// stateful consumer between the nodes of a local Kubernetes cluster while
// a producer keeps sending: one per strategy with the AMQP consumer
// (stop-and-copy, ms2m and ms2m-cutoff of a Deployment's pod, statefulset
// and statefulset-shadow of a StatefulSet's), and ms2m of a Deployment's
// pod with the Go NATS consumer (a durable JetStream pull consumer; the
// row "ms2m (NATS)", fed by lab.NATSStream's producer, whose Nats-Msg-Id
// and x-sent-at the NATS consumer journals, so that the row has its
// processing gap too).
//
// It brings up the local cluster of real nodes (e2e/cluster, through
// e2e/lab) in its own state folder and the admission webhook, starts the
// sample Go consumer as a Deployment or StatefulSet of one replica on node
// 1 (opted in by annotation, injected by the webhook), feeds it with the
// sample producer, and moves its pod to node 2 with migrate.Run, printing
// each phase as it ends. When the producer is done it reads the restored
// consumer's hash chain and compares it with the producer's: equal means
// every message was processed exactly once, in order, across the
// migration. It prints a table (total time; downtime, which is the
// processing gap read from the consumers' journals, e2e/lab/journal; the
// migrator's switch time; messages lost and duplicated, derived as
// tally.go says; and whether the hash is the producer's with no redelivery
// skipped) and ms2m's downtime as a share of stop-and-copy's (both with
// the AMQP consumer), deletes the workloads, queues, streams and replay
// logs it made, and takes the cluster down, on failure and on Ctrl-C too,
// unless -keep is given. It exits non-zero when a migration failed or a
// hash does not match.
package main
