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
	// KindPublish is a publish the app made while it handled the delivery
	// with ID For. Only a sidecar with publish checking on writes it (see
	// Record.For); replay compares the target app's publishes against it.
	KindPublish Kind = 4
)

// PublishDigestLen is the length of a KindPublish record's Body: the
// SHA-256 of the published body.
const PublishDigestLen = 32

// Record is one entry of a pod's replay log.
//
// For KindDelivery, ID is the delivery's sequence ID: it grows by one per
// delivery, across connections, channels and sidecar restarts. For
// KindCutoff, KindResume and KindPublish, ID is the last delivery ID handed
// out before the record, and Epoch tells markers apart.
//
// A KindPublish record carries the publish's Exchange and RoutingKey, the
// delivery it is attributed to in For, and in Body the SHA-256 of the
// published body (not the body: the log stays small, and the check only
// needs equality).
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
	// For is the delivery ID a KindPublish record is attributed to; zero
	// for every other kind.
	For uint64
	// Repeats, on a KindDelivery record, is the ID of an earlier delivery
	// of the same message: the sidecar handed it to an app whose channel or
	// connection then ended before it settled it, the broker requeued it,
	// and this is its redelivery to the same sidecar (matched by queue,
	// exchange, routing key, properties and body). It names the first
	// delivery of the chain, also when the message came back more than
	// once. A replay that replays that first delivery leaves this record
	// out; one that does not (the first precedes its checkpoint, or a
	// rebuild of an app that lost it skips it) replays this one. Zero
	// when the record repeats nothing.
	Repeats uint64
}

// Publish is what publish checking compares of one app publish.
type Publish struct {
	Exchange   string
	RoutingKey string
	Digest     [PublishDigestLen]byte // SHA-256 of the body
}

// Publish returns the publish a KindPublish record describes.
func (r *Record) Publish() Publish {
	p := Publish{Exchange: r.Exchange, RoutingKey: r.RoutingKey}
	copy(p.Digest[:], r.Body)
	return p
}
