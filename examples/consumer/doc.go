// Command consumer is a stateful RabbitMQ consumer: it folds a SHA-256 hash
// chain over the bodies of the messages it processes, keeps that state in
// memory only, and serves it over HTTP. It reconnects by itself, keeping its
// state, whenever its connection or channel drops. Configuration comes from
// the environment; run it with -h for the list. See examples/README.md.
package main
