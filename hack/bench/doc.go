// Command bench measures what the ms2m sidecar costs an app and what a
// handover costs it, in five parts (select them with -only). overhead runs
// the same consumer straight against RabbitMQ and through an in-process
// sidecar (tee to the replay log on): consumer throughput at prefetch 100
// and 1, and delivery latency at a paced 1,000 msg/s. replay compares a
// consumer behind a target sidecar that replays a replay log with the same
// consumer draining a queue straight from the broker. handover runs a
// source and a target sidecar, each with a 50 ms-per-message consumer, under
// a steady producer, hands over with control.Handover, and reports the
// downtime and whether every message was processed exactly once. Two parts
// run on a local cluster of real nodes (e2e/cluster, state in
// -cluster-state, taken down at the end): criu times the kubelet's
// checkpoint, the checkpoint image and the restore on another node against
// the app's resident memory (hack/bench/ballast), beside raw CRIU dumping
// and restoring the same program on the host; strategies migrates a
// consumer between the nodes with ms2m and with stop-and-copy and compares
// their downtime, the processing gap read from the consumers' journals
// (e2e/lab/journal), beside the migrator's switch time, checking the
// restored state's hash (and that no redelivery was skipped) every time. Compared
// paths alternate round by round so that a noisy machine hurts both alike.
// It prints a Markdown block for BENCHMARKS.md to stdout and writes the raw
// figures to out/bench/sidecar.json (out/bench/sidecar-<parts>.json when not
// every part runs). Every queue and replay log it creates is deleted before
// it exits, on error and on Ctrl-C too. Run it with `make bench`.
//
// The subcommand paper (`go -C hack/bench run . paper`, `make bench-paper`;
// paper.go) reproduces the paper's evaluation on the same local cluster:
// stop-and-copy, ms2m, ms2m-cutoff, statefulset and statefulset-shadow
// (and, when -strategies asks for it, ms2m-cutoff-adaptive: ms2m-cutoff by
// the adaptive rule, beside the formula) migrating a fresh consumer at
// each producer rate, run after run, with
// the processing gap, the worst latency and the lost and repeated messages
// read from the consumers' journals (GET /folds), the switch time beside
// the gap, and means, medians and p95s. It writes results.csv, results.json
// and the figures (package paperplot) to out/bench-paper, prints PASS or
// MISS per goal, and replaces its section of BENCHMARKS.md.
//
// The subcommand memory (`make bench-memory`; memory.go) migrates a
// consumer holding more and more state, and splits each migration's
// checkpoint and restore into their parts (parts.go): the migrator's
// Report.Parts, and the restore's steps by the target node's containerd
// log; -pull-ahead both runs each migration without and with
// migrate.Plan.PullAhead, side by side.
package main
