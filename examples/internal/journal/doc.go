// Package journal is the sample Go consumers' journal: every folded
// message in fold order, bounded, as GET /folds serves it. A benchmark
// reads the journals of every instance that served across a migration to
// find the processing gap (e2e/lab/journal), so the AMQP and the NATS
// consumer keep the same one.
package journal
