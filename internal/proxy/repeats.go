package proxy

import (
	"cmp"
	"hash/maphash"
	"sync"
	"time"

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

// seed remembers the deliveries among recs, a log's last records in log
// order, as a restarted sidecar's guess at what went back: the sidecar that
// wrote them may have died with its app (the pod's containers restarting
// together), and then the broker took back, unremembered, whatever the app
// held. Each chain of deliveries of one message is remembered once, under
// its first delivery's ID: a delivery that repeats nothing adds itself; a
// repeat (Record.Repeats) adds its first only when that is older than recs,
// which left it out. It returns how many it remembered.
//
// It is a guess from above. A delivery the app acked is never redelivered,
// so its entry only ages out; one matched by take is one the broker
// redelivered (take is asked only for redelivered messages), which names
// its first delivery as a living sidecar would have, unless an older
// message printed alike is still remembered (requeuedMessages says what
// that does). A delivery older than recs, or than the last
// maxRequeuedMessages, is not remembered: its redelivery is logged as a
// first delivery, and a replay of both folds it twice.
func (m *requeuedMessages) seed(recs []shadowqueue.Record) int {
	added := map[uint64]bool{}
	for i := range recs {
		r := &recs[i]
		if r.Kind != shadowqueue.KindDelivery {
			continue
		}
		first := cmp.Or(r.Repeats, r.ID)
		if added[first] {
			continue
		}
		added[first] = true
		m.add(printOf(r), first)
	}
	return len(added)
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

// ackedMessages remembers the messages an app acked whose ack may not have
// reached the broker: those it acked while the sidecar drained its
// connection after the broker's went (the ack could not go), and those it
// acked shortly before (the ack may have been lost with the connection).
// The broker redelivers each of those it did not get; a redelivery
// (redelivered set) whose print is here is absorbed: the sidecar acks it
// upstream and the app, which folded the message already, never sees it
// (absorbRedelivery). An ack the broker did get leaves its print here
// unused until it is evicted.
//
// Only the app's own acks add to it, so an app cannot make the sidecar
// absorb a message it did not ack; it keeps the last maxRequeuedMessages.
// Messages that print alike (the same body on the same queue) are not told
// apart, as in requeuedMessages.
type ackedMessages struct {
	mu      sync.Mutex
	byPrint map[messagePrint]int
	order   []messagePrint // as added, for eviction
}

// add remembers that the app acked the message printed p.
func (m *ackedMessages) add(p messagePrint) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byPrint == nil {
		m.byPrint = map[messagePrint]int{}
	}
	m.byPrint[p]++
	m.order = append(m.order, p)
	for len(m.order) > maxRequeuedMessages {
		m.drop(m.order[0])
		m.order = m.order[1:]
	}
}

// take reports whether a message printed p is remembered, and forgets one.
func (m *ackedMessages) take(p messagePrint) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byPrint[p] == 0 {
		return false
	}
	m.drop(p)
	for i, x := range m.order {
		if x == p {
			m.order = append(m.order[:i], m.order[i+1:]...)
			break
		}
	}
	return true
}

func (m *ackedMessages) drop(p messagePrint) {
	if m.byPrint[p]--; m.byPrint[p] <= 0 {
		delete(m.byPrint, p)
	}
}

// empty reports whether it remembers nothing: the common case, in which
// a redelivery goes to the app at once.
func (m *ackedMessages) empty() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.byPrint) == 0
}

// recentAck is one delivery the app acked, kept by its connection for a
// while in case the broker's connection goes before the ack is through.
type recentAck struct {
	print messagePrint
	at    time.Time
}

// maxRecentAcks bounds a connection's recent acks.
const maxRecentAcks = 1024

// recentAcks is a ring of a connection's last acks.
type recentAcks struct {
	buf  []recentAck
	next int
}

func (r *recentAcks) add(a recentAck) {
	if len(r.buf) < maxRecentAcks {
		r.buf = append(r.buf, a)
		return
	}
	r.buf[r.next] = a
	r.next = (r.next + 1) % maxRecentAcks
}

// since calls fn with each ack made at or after t.
func (r *recentAcks) since(t time.Time, fn func(messagePrint)) {
	for _, a := range r.buf {
		if !a.at.Before(t) {
			fn(a.print)
		}
	}
}
