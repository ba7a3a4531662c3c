// Command consumer-nats is a stateful NATS JetStream consumer: it folds a
// SHA-256 hash chain over the bodies of the messages it processes (as the
// AMQP sample consumer does), keeps that state in memory only, and serves
// it over HTTP, with the same journal of folds (GET /folds: each message's
// Nats-Msg-Id and x-sent-at header, the producer's send time). It binds to a durable consumer, push or pull (MODE), and
// acks each message after folding it. nats.go reconnects by itself,
// keeping the state. Run it with -h for the environment it reads.
package main
