// Command bench measures what the ms2m sidecar costs an app: it runs the
// same consumer straight against RabbitMQ and through an in-process sidecar
// (tee to the replay log on), alternating the two paths round by round so
// that a noisy machine hurts both alike. It measures consumer throughput at
// prefetch 100 and 1, and delivery latency at a paced 1,000 msg/s, prints a
// Markdown block for BENCHMARKS.md to stdout and writes the raw figures to
// out/bench/sidecar.json. Every queue and replay log it creates is deleted
// before it exits, on error and on Ctrl-C too. Run it with `make bench`.
package main
