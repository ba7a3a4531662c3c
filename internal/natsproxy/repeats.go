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
type firstDeliveries struct {
	mu    sync.Mutex
	byMsg map[messageKey]uint64
	order []messageKey // as added, for eviction
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

// note remembers id as the first delivery of the message k, unless one
// is known.
func (f *firstDeliveries) note(k messageKey, id uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.byMsg[k]; ok {
		return
	}
	if f.byMsg == nil {
		f.byMsg = map[messageKey]uint64{}
	}
	f.byMsg[k] = id
	f.order = append(f.order, k)
	for len(f.order) > maxFirstDeliveries {
		delete(f.byMsg, f.order[0])
		f.order = f.order[1:]
	}
}

// first returns the first delivery's ID of the message k, or 0.
func (f *firstDeliveries) first(k messageKey) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byMsg[k]
}
