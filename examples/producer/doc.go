// Command producer publishes a numbered sequence of persistent messages
// ("msg-<n>") to a RabbitMQ queue at a steady rate, with publisher confirms,
// and prints one JSON line with the SHA-256 hash chain over the bodies it sent.
// A consumer that processed every message exactly once, in order, ends with
// the same hash. See examples/README.md.
package main
