package proxy

import (
	"hash/maphash"
	"sync"

	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// messagePrint identifies a message across its deliveries: a hash of its
// queue, exchange, routing key and body. The properties are left out: a
// quorum queue adds x-delivery-count to a redelivery's headers. Two
// messages with the same body on the same queue print alike; see
// requeuedMessages for what that can do.
type messagePrint uint64

// printSeed is the process's seed: prints are compared only within it.
var printSeed = maphash.MakeSeed()

// printOf returns r's print. It does not allocate.
func printOf(r *shadowqueue.Record) messagePrint {
	h := maphash.String(printSeed, r.Queue)
	h = h*31 + maphash.String(printSeed, r.Exchange)
	h = h*31 + maphash.String(printSeed, r.RoutingKey)
	h = h*31 + maphash.Bytes(printSeed, r.Body)
	return messagePrint(h)
}

// requeuedMessages remembers the messages the broker took back when an
// app's channel or connection ended holding them, each with the ID of its
// first delivery, so that the broker's redelivery of one to this sidecar
// is logged as repeating it (shadowqueue.Record.Repeats): a replay then
// gives an app the message once, not once per delivery.
//
// It keeps the last maxRequeuedMessages. Messages that print alike (the
// same body on the same queue) are taken oldest first; if one of them was
// requeued here and another, delivered first to another consumer, comes
// here redelivered, the second is marked as the first's repeat: a replay
// of this pod's log then holds that body once fewer and the first's own
// redelivery once more, which leaves the count of each body right.
type requeuedMessages struct {
	mu      sync.Mutex
	byPrint map[messagePrint][]requeuedMessage // oldest first
	order   []requeuedMessage                  // as added, for eviction
	seq     uint64                             // numbers the adds
}

type requeuedMessage struct {
	print messagePrint
	first uint64 // the first delivery's ID
	seq   uint64 // which add: a message can go back more than once
}

// maxRequeuedMessages bounds requeuedMessages, as MaxRequeued bounds the
// list /state reports.
const maxRequeuedMessages = MaxRequeued

// add remembers that the message printed p, first delivered as first, went
// back to the broker.
func (m *requeuedMessages) add(p messagePrint, first uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byPrint == nil {
		m.byPrint = map[messagePrint][]requeuedMessage{}
	}
	m.seq++
	e := requeuedMessage{print: p, first: first, seq: m.seq}
	m.byPrint[p] = append(m.byPrint[p], e)
	m.order = append(m.order, e)
	for len(m.order) > maxRequeuedMessages {
		m.remove(m.order[0])
		m.order = m.order[1:]
	}
}

// take returns the first delivery ID of the oldest message printed p that
// went back to the broker, and forgets it; 0 if there is none.
func (m *requeuedMessages) take(p messagePrint) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	es := m.byPrint[p]
	if len(es) == 0 {
		return 0
	}
	m.remove(es[0])
	return es[0].first
}

// remove forgets e, if it is still there (take may have had it).
func (m *requeuedMessages) remove(e requeuedMessage) {
	es := m.byPrint[e.print]
	for i, x := range es {
		if x.seq == e.seq {
			es = append(es[:i:i], es[i+1:]...)
			break
		}
	}
	if len(es) == 0 {
		delete(m.byPrint, e.print)
		return
	}
	m.byPrint[e.print] = es
}

// len returns how many messages it remembers.
func (m *requeuedMessages) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, f := range m.byPrint {
		n += len(f)
	}
	return n
}
