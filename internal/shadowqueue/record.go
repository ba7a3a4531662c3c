package shadowqueue

import (
	"slices"
	"time"
)

// Kind says what a record in the replay log is.
type Kind uint8

const (
	// KindDelivery is one delivery that the sidecar handed to the app.
	KindDelivery Kind = 1
	// KindCutoff marks the end of a source's tenure: no delivery with an ID
	// above Record.ID was handed out by the sidecar that wrote it, until a
	// matching KindResume record (if any). Its Body names the queues the
	// app consumed then (CutoffBody, Record.CutoffQueues); a marker from a
	// sidecar older than that has none.
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

// MaxCutoffQueues and MaxCutoffQueueLen bound the queues a cutoff marker
// names: an AMQP queue name is a short string (255 bytes); a NATS replay
// key is a stream and a consumer name.
const (
	MaxCutoffQueues   = 4096
	MaxCutoffQueueLen = 1024
)

// CutoffBody encodes queues as a KindCutoff record's Body: each queue as a
// uvarint length and its bytes, in ascending order, each once. Queues
// beyond the bounds are left out (the replay then treats them as it did
// before markers named queues). A target that replays to this marker
// knows the queues the source's app consumed, including those that never
// had a delivery, so it can switch them to the broker at once instead of
// refusing them as unknown.
func CutoffBody(queues []string) []byte {
	qs := slices.Clone(queues)
	slices.Sort(qs)
	qs = slices.Compact(qs)
	var b []byte
	n := 0
	for _, q := range qs {
		if len(q) > MaxCutoffQueueLen || n == MaxCutoffQueues {
			continue
		}
		b = appendString(b, q)
		n++
	}
	return b
}

// CutoffQueues decodes a KindCutoff record's Body (CutoffBody). An empty
// Body names no queue. DecodeRecord has checked it for records read from a
// log.
func (r *Record) CutoffQueues() ([]string, error) {
	d := decoder{buf: r.Body}
	var out []string
	for len(d.buf) > 0 && d.err == nil {
		if len(out) == MaxCutoffQueues {
			d.fail("Body", "a cutoff marker names more than %d queues", MaxCutoffQueues)
			break
		}
		n := d.readUvarint("Body")
		if d.err == nil && n > MaxCutoffQueueLen {
			d.fail("Body", "a queue of %d bytes in a cutoff marker, at most %d", n, MaxCutoffQueueLen)
		}
		if d.err == nil && n > uint64(len(d.buf)) {
			d.fail("Body", "a queue of %d bytes in a cutoff marker, %d left", n, len(d.buf))
		}
		if d.err != nil {
			break
		}
		q := string(d.buf[:n])
		d.buf = d.buf[n:]
		if len(out) > 0 && q <= out[len(out)-1] {
			d.fail("Body", "the queues of a cutoff marker are not in ascending order, each once (%q after %q)", q, out[len(out)-1])
			break
		}
		out = append(out, q)
	}
	if d.err != nil {
		return nil, d.err
	}
	return out, nil
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
