// Package shadowqueue is the sidecar's replay log: the durable copy of every
// delivery that the sidecar hands to the app.
//
// A Tee assigns each delivery its sequence ID, in the order the app receives
// them, and writes the records to a Log in that order, one batch in flight at
// a time. It tells the proxy when a record is durable (Wait), which is what
// gates the app's acks (invariant I1: a message leaves the primary queue only
// after it is in the log). A Log that fails is retried with the same records
// until it succeeds; the Tee reports itself degraded meanwhile and nothing is
// dropped. StreamLog is the Log on a RabbitMQ stream; JetStreamLog is the
// Log on a NATS JetStream stream, for NATS workloads, with the same record
// format, cutoff and resume markers.
package shadowqueue
