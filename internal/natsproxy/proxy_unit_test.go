package natsproxy

import (
	"fmt"
	"testing"

	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// TestUnackedSetStaysBounded: settled subjects do not pile up in the
// set's order list, and beyond its bound the oldest unsettled ones are
// forgotten first.
func TestUnackedSetStaysBounded(t *testing.T) {
	s := newUnackedSet(100)
	for i := range 100000 {
		subj := fmt.Sprint("$JS.ACK.S.C.1.", i)
		s.add(subj, delivery{tk: shadowqueue.Ticket(i), msg: messageKey{seq: uint64(i)}})
		if _, ok := s.lookup([]byte(subj), true); !ok {
			t.Fatalf("delivery %d not found", i)
		}
	}
	if len(s.order) > 2*0+1024+1 || s.len() != 0 {
		t.Fatalf("after 100000 settled deliveries: order holds %d subjects, set %d", len(s.order), s.len())
	}
	for i := range 150 {
		s.add(fmt.Sprint("u", i), delivery{tk: shadowqueue.Ticket(i), msg: messageKey{seq: uint64(i)}})
	}
	if s.len() != 100 {
		t.Fatalf("set holds %d, want its bound 100", s.len())
	}
	if _, ok := s.lookup([]byte("u49"), false); ok {
		t.Error("u49, among the oldest, is still remembered")
	}
	if _, ok := s.lookup([]byte("u50"), false); !ok {
		t.Error("u50 was forgotten")
	}
}

// TestUnackedSetRedeliveryReplaces: the server's redelivery of a message
// replaces its earlier delivery, whose ack would never come (the app that
// held it died); settling the redelivery leaves nothing to wait for.
func TestUnackedSetRedeliveryReplaces(t *testing.T) {
	s := newUnackedSet(100)
	msg := keyOf([]byte("S"), []byte("C"), 7)
	other := keyOf([]byte("S"), []byte("C2"), 7) // another consumer's
	s.add("$JS.ACK.S.C.1.7.7.0.0", delivery{id: 1, msg: msg})
	s.add("$JS.ACK.S.C2.1.7.7.0.0", delivery{id: 2, msg: other})
	s.add("$JS.ACK.S.C.2.7.9.0.0", delivery{id: 3, msg: msg})
	if n := s.len(); n != 2 {
		t.Fatalf("set holds %d, want 2: the redelivery in place of the first, and the other consumer's", n)
	}
	if _, ok := s.lookup([]byte("$JS.ACK.S.C.1.7.7.0.0"), false); ok {
		t.Error("the first delivery is still waited for")
	}
	if d, ok := s.lookup([]byte("$JS.ACK.S.C.2.7.9.0.0"), true); !ok || d.id != 3 {
		t.Errorf("the redelivery: %+v %v", d, ok)
	}
	if _, ok := s.byMsg[msg]; ok {
		t.Error("the settled message is still indexed")
	}
}

// TestUnackedSetAfterItsConnectionEnded: the deliveries of a connection
// that ended are no longer awaited (a quiesce or stop does not wait for
// them) but stay known: an ack of one, on any connection, still finds it;
// a redelivery of one, on an open connection, is awaited in its place.
func TestUnackedSetAfterItsConnectionEnded(t *testing.T) {
	s := newUnackedSet(3)
	a, b := &connOrigin{}, &connOrigin{}
	msg := func(seq uint64) messageKey { return keyOf([]byte("S"), []byte("C"), seq) }
	s.add("a1", delivery{id: 1, msg: msg(1), from: a})
	s.add("a2", delivery{id: 2, msg: msg(2), from: a})
	s.add("b3", delivery{id: 3, msg: msg(3), from: b})
	if got := s.awaited(); got != 3 {
		t.Fatalf("awaited %d, want 3", got)
	}
	s.connEnded(a)
	if got, known := s.awaited(), s.len(); got != 1 || known != 3 {
		t.Fatalf("after a's end: awaited %d, known %d; want 1 (b's), 3", got, known)
	}
	if d, ok := s.lookup([]byte("a1"), true); !ok || d.id != 1 {
		t.Errorf("the ack of a's delivery 1 after a ended: %+v %v; want it found", d, ok)
	}
	s.add("b2", delivery{id: 4, msg: msg(2), from: b}) // the server redelivers a's 2 on b
	if _, ok := s.lookup([]byte("a2"), false); ok {
		t.Error("a's delivery 2 is still known after its redelivery")
	}
	if got := s.awaited(); got != 2 {
		t.Errorf("awaited %d, want 2: b's 3 and the redelivery", got)
	}
	s.connEnded(b)
	s.add("b5", delivery{id: 5, msg: msg(5), from: b}) // a held delivery released as b ended
	if got, known := s.awaited(), s.len(); got != 0 || known != 3 {
		t.Errorf("after b's end: awaited %d, known %d; want 0, 3", got, known)
	}
	c := &connOrigin{}
	s.add("c6", delivery{id: 6, msg: msg(6), from: c}) // beyond the bound: b3, the oldest, goes
	if _, ok := s.lookup([]byte("b3"), false); ok || s.len() != 3 || s.awaited() != 1 {
		t.Errorf("past the bound: b3 known %v, %d known, %d awaited; want b3 forgotten, 3, 1", ok, s.len(), s.awaited())
	}
	for _, subj := range []string{"b2", "b5", "c6"} {
		if _, ok := s.lookup([]byte(subj), true); !ok {
			t.Errorf("the ack of %s: not found", subj)
		}
	}
	if s.awaited() != 0 || s.len() != 0 || c.open != 0 {
		t.Errorf("all settled: %d awaited, %d known, %d open on c; want 0", s.awaited(), s.len(), c.open)
	}
}

func TestFirstDeliveries(t *testing.T) {
	var f firstDeliveries
	a, b := keyOf([]byte("S"), []byte("C"), 1), keyOf([]byte("S"), []byte("C"), 2)
	if keyOf([]byte("S"), []byte("C"), 1) != a || keyOf([]byte("SC"), nil, 1) == a {
		t.Fatal("keyOf: the same message keys differently, or stream and consumer run together")
	}
	f.note(a, 10)
	f.note(a, 12) // noted again: first is still the older
	if got := f.first(a); got != 10 {
		t.Errorf("first of a = %d, want 10", got)
	}
	if got := f.first(b); got != 0 {
		t.Errorf("first of b = %d, want 0", got)
	}
	for i := range maxFirstDeliveries {
		f.note(keyOf([]byte("S"), []byte("C"), uint64(100+i)), uint64(100+i))
	}
	if got := f.first(a); got != 0 {
		t.Errorf("first of a = %d after %d later deliveries, want it forgotten", got, maxFirstDeliveries)
	}
	if got := f.first(keyOf([]byte("S"), []byte("C"), 100)); got != 100 {
		t.Errorf("first of the oldest kept = %d, want 100", got)
	}
	if n := len(f.ring); n != maxFirstDeliveries {
		t.Errorf("%d remembered, want %d", n, maxFirstDeliveries)
	}
}
