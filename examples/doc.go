// Package examples holds the integration tests for the sample apps under this
// directory: a producer, a Go consumer and a Python (pika) consumer. They are
// the reference workload for ms2m and know nothing about it: each consumer
// folds a SHA-256 hash chain over the message bodies it processes, and a test
// compares its final hash with the one the producer printed. See README.md.
package examples
