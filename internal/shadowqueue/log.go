package shadowqueue

import "context"

// Log is a durable, append-only replay log. The Tee is its only writer in a
// sidecar; replay readers use Reader.
//
// A RabbitMQ stream implements it (StreamLog), and so does a NATS
// JetStream stream (JetStreamLog), with no change to the Tee.
type Log interface {
	// Write appends recs, in order, and returns once the broker has
	// confirmed every one of them as durably stored. On error, any prefix of
	// recs may have been stored: the caller writes the same records again,
	// and readers skip IDs they have already seen. Write keeps no
	// reference to recs once it returns: the Tee reuses the slice.
	Write(ctx context.Context, recs []Record) error
	// Last returns the last record in the log, or ok=false when it is empty.
	Last(ctx context.Context) (rec Record, ok bool, err error)
	// Close releases the log's connections.
	Close() error
}
