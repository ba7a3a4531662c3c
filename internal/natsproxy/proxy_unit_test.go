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
		s.add(subj, delivery{tk: shadowqueue.Ticket(i)})
		if _, ok := s.lookup([]byte(subj), true); !ok {
			t.Fatalf("delivery %d not found", i)
		}
	}
	if len(s.order) > 2*0+1024+1 || s.len() != 0 {
		t.Fatalf("after 100000 settled deliveries: order holds %d subjects, set %d", len(s.order), s.len())
	}
	for i := range 150 {
		s.add(fmt.Sprint("u", i), delivery{tk: shadowqueue.Ticket(i)})
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
