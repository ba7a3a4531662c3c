// Package natswire is the NATS client protocol codec of the sidecar's NATS
// proxy: a push Parser that cuts a byte stream into protocol messages (INFO,
// CONNECT, PUB, HPUB, SUB, UNSUB, MSG, HMSG, PING, PONG, +OK, -ERR) without
// copying, append-style encoders for the messages the proxy writes itself,
// and helpers for the two places the proxy looks into a message's content:
// the INFO JSON (to strip the cluster URLs a server advertises) and the
// JetStream ack subjects ($JS.ACK...) that carry a delivery's stream
// sequence. Everything else passes through byte for byte.
//
// # Buffer lifetime
//
// A Msg given to a Parser callback aliases either the caller's input (a
// message lying wholly inside one chunk passed to Parse) or the Parser's
// internal buffer (a message split across chunks). Msg.Raw and every slice
// field are valid only until the callback returns; copy them to keep them.
// The Parser never holds on to the caller's chunk after Parse returns: it
// copies the bytes of an incomplete trailing message.
//
// The Append functions only append to dst and return the extended slice;
// they allocate only when dst must grow, and never keep dst.
//
// # Limits
//
// A control line longer than the Parser's line limit, and a payload (headers
// and body) larger than its max_payload, are rejected as soon as the
// control line is complete, before any of the payload is buffered. Errors
// are *Error values; the proxy closes the connection on any of them, as a
// NATS server does on a protocol violation.
package natswire
