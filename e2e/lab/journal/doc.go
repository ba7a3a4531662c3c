// Package journal reads what the sample Go consumer's journals (its GET
// /folds) say about a migration, with no I/O: the processing gap, the
// longest interval in which no instance finished a message while one was
// waiting. It is the downtime as the consumer's users see it, freeze
// included, and the headline downtime of `make demo`, the benchmarks and
// the end-to-end tests.
package journal
