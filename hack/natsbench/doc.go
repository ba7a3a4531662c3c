// Command natsbench measures the NATS sidecar's cost on a JetStream
// consumer: the same nats.go pull consumer drains a pre-filled stream
// straight from the server and through an in-process natsproxy with its
// tee on a JetStream replay log (acks held until the log has the delivery),
// alternating the two paths round by round, and reports messages per second
// and the ratio. It needs the local nats-server (make setup).
package main
