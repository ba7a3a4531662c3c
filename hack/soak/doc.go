// Command soak runs migrations again and again until a count is reached,
// checks each one, and appends one JSON record per migration
// (internal/soak) to <out>/<mode>.jsonl: `make soak SOAKFLAGS='...'`. It
// works in chunks; a run holds the output folder under a file lock, is
// safe to stop (SIGINT or SIGTERM: after the migration under way; a
// second one: at once), and a new run of the same command goes on from
// what the file holds. The summary subcommand prints the records of a
// folder as tables: counts per outcome and the p50 and p95 of the totals,
// per strategy (and per fault).
//
// Modes: pingpong runs TestPingPong (e2e/pingpong_test.go) on the local
// cluster of real nodes, chunk by chunk, each chunk under the real-node
// lock (-node-lock): a Deployment's pod moved back and forth by ms2m and
// a StatefulSet's by statefulset-shadow, the consumer's state checked
// after every migration (lab.CheckPrefix). sim runs randomized migrations
// with injected faults on the simulated cluster (internal/simcluster) by
// the real `migrator controller`. docs/soak.md.
package main
