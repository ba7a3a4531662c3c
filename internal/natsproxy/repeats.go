package natsproxy

import (
	"hash/maphash"
	"sync"
)

// A JetStream message is one stream sequence of one stream; the server
// hands it to a consumer again (delivery count above 1) when the app did
// not ack it within the consumer's ack wait, naked it, or its ack was
// lost. firstDeliveries remembers, for the last maxFirstDeliveries
// deliveries this sidecar logged, the log ID of the first delivery of
// each message, so that a redelivery is logged as repeating it
// (shadowqueue.Record.Repeats): a replay then gives the app the message
// once. Unlike AMQP's, the identity is exact: stream, consumer and
// stream sequence.
//
// The ring is written on every delivery and read only for a redelivery:
// a note costs one slot's store, where a map cost a hash probe into a
// table of 16,384 entries (and the eviction's delete), about half a
// microsecond a delivery; a lookup scans the ring, some tens of
// microseconds, once per redelivery.
type firstDeliveries struct {
	mu   sync.Mutex
	ring []firstDelivery // maxFirstDeliveries slots once full
	next int             // the slot the next note takes, once full
}

type firstDelivery struct {
	msg messageKey
	id  uint64
}

// messageKey names one message of one consumer: a hash of the stream and
// consumer names (kept as a hash so that a delivery allocates nothing
// here), and the stream sequence.
type messageKey struct {
	consumer uint64
	seq      uint64
}

var keySeed = maphash.MakeSeed()

func keyOf(stream, consumer []byte, seq uint64) messageKey {
	return messageKey{consumer: maphash.Bytes(keySeed, stream)*31 + maphash.Bytes(keySeed, consumer), seq: seq}
}

// maxFirstDeliveries bounds firstDeliveries: well above a consumer's
// default max_ack_pending (1,000), so that what an app held when it died
// is still known when the server redelivers it.
const maxFirstDeliveries = 16384

// note remembers id as a delivery of the message k. The caller notes a
// message only when first knows none, or for a first delivery (delivery
// count 1); should a message be noted twice, first returns the older ID.
func (f *firstDeliveries) note(k messageKey, id uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.ring) < maxFirstDeliveries {
		f.ring = append(f.ring, firstDelivery{k, id})
		return
	}
	f.ring[f.next] = firstDelivery{k, id}
	f.next = (f.next + 1) % maxFirstDeliveries
}

// first returns the first delivery's ID of the message k, or 0.
func (f *firstDeliveries) first(k messageKey) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Oldest first: from next to the end, then from the start.
	for _, part := range [2][]firstDelivery{f.ring[f.next:], f.ring[:f.next]} {
		for _, d := range part {
			if d.msg == k {
				return d.id
			}
		}
	}
	return 0
}
