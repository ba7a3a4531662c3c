// Command natspubcost measures what storing a replay log costs a
// nats-server per byte: it publishes the same number of bytes to a fresh
// JetStream stream on file storage in messages of each size, once
// pipelined (PublishAsync, as many in flight as the client allows) and
// once one at a time (each publish waits for its PubAck, as the Tee's
// writes do), and prints the server's CPU time per publish and per 270
// bytes (the size of a record of a 100-byte NATS delivery). Run it against
// a server of its own (-server-pid), so that nothing else's work is
// counted.
package main
