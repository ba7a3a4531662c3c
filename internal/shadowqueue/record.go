package shadowqueue

import "time"

// Kind says what a record in the replay log is.
type Kind uint8

const (
	// KindDelivery is one delivery that the sidecar handed to the app.
	KindDelivery Kind = 1
	// KindCutoff marks the end of a source's tenure: no delivery with an ID
	// above Record.ID was handed out by the sidecar that wrote it, until a
	// matching KindResume record (if any).
	KindCutoff Kind = 2
	// KindResume voids the KindCutoff record with the same Epoch: the source
	// went on serving after a migration was abandoned.
	KindResume Kind = 3
)

// Record is one entry of a pod's replay log.
//
// For KindDelivery, ID is the delivery's sequence ID: it grows by one per
// delivery, across connections, channels and sidecar restarts. For
// KindCutoff and KindResume, ID is the last delivery ID handed out before
// the marker, and Epoch tells markers apart.
type Record struct {
	Kind Kind
	ID   uint64
	// Epoch numbers the cutoff and resume markers of one log. A delivery
	// carries the epoch of the last marker before it, so that a sidecar that
	// restarts from the log's last record goes on with the right epoch.
	Epoch uint64
	// Time is when the sidecar handed the delivery to the app (or wrote the marker).
	Time time.Time

	Queue       string
	Exchange    string
	RoutingKey  string
	ConsumerTag string // empty for basic.get
	Redelivered bool
	// Properties is the AMQP 0-9-1 basic property list exactly as the broker
	// sent it in the content header: the 16-bit property flags followed by
	// the property values. Replay can send it back byte for byte.
	Properties []byte
	Body       []byte
}
