package natsproxy

import (
	"strings"
	"testing"

	"github.com/ms2m/ms2m/internal/natswire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

func TestSubjectMatches(t *testing.T) {
	for name, tc := range map[string]struct {
		pattern, subject string
		want             bool
	}{
		"exact":              {"_INBOX.abc", "_INBOX.abc", true},
		"other":              {"_INBOX.abc", "_INBOX.abd", false},
		"longer subject":     {"_INBOX.abc", "_INBOX.abc.x", false},
		"longer pattern":     {"_INBOX.abc.x", "_INBOX.abc", false},
		"star":               {"_INBOX.abc.*", "_INBOX.abc.tok", true},
		"star one token":     {"_INBOX.abc.*", "_INBOX.abc.tok.more", false},
		"star needs a token": {"_INBOX.abc.*", "_INBOX.abc", false},
		"tail":               {"orders.>", "orders.eu.new", true},
		"tail needs a token": {"orders.>", "orders", false},
		"star middle":        {"a.*.c", "a.b.c", true},
	} {
		if got := subjectMatches(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("%s: subjectMatches(%q, %q) = %v, want %v", name, tc.pattern, tc.subject, got, tc.want)
		}
	}
}

// TestReplayReply: a replayed delivery's reply subject is a v2 $JS.ACK
// subject with the record's stream, consumer and sequences, the sidecar's
// mark, and the record's ID last; a replay of it again counts one more
// delivery.
func TestReplayReply(t *testing.T) {
	rec := shadowqueue.Record{ID: 42, Exchange: "$JS.ACK.ORDERS.worker.1.17.5.1700000000000000000.3"}
	for _, redelivered := range []bool{false, true} {
		got := string(replayReply(&rec, redelivered))
		if !strings.HasPrefix(got, replayAckPrefix) || !strings.HasSuffix(got, ".42") {
			t.Fatalf("replayReply = %q", got)
		}
		a, ok := natswire.ParseJSAck([]byte(got))
		wantDelivered := uint64(1)
		if redelivered {
			wantDelivered = 2
		}
		if !ok || string(a.Stream) != "ORDERS" || string(a.Consumer) != "worker" || a.StreamSeq != 17 || a.ConsumerSeq != 5 ||
			a.Timestamp != 1700000000000000000 || a.Pending != 3 || a.Delivered != wantDelivered {
			t.Errorf("replayReply = %q parses as %+v (ok %v)", got, a, ok)
		}
	}
}

// TestReplayRecordErr: a record from the log is tenant data that goes into
// protocol lines; one that no server could have delivered fails the replay.
func TestReplayRecordErr(t *testing.T) {
	k := newKeyReplay("ORDERS", "worker")
	good := shadowqueue.Record{ID: 7, RoutingKey: "orders.new", Exchange: "$JS.ACK.ORDERS.worker.1.2.2.1.0", Properties: []byte("NATS/1.0\r\nK: v\r\n\r\n")}
	if err := replayRecordErr(&good, k); err != nil {
		t.Fatalf("a good record: %v", err)
	}
	for name, edit := range map[string]func(*shadowqueue.Record){
		"subject with a space":   func(r *shadowqueue.Record) { r.RoutingKey = "orders new" },
		"subject with CRLF":      func(r *shadowqueue.Record) { r.RoutingKey = "orders\r\nPUB x 1" },
		"empty subject":          func(r *shadowqueue.Record) { r.RoutingKey = "" },
		"wildcard subject":       func(r *shadowqueue.Record) { r.RoutingKey = "orders.*" },
		"ack subject of another": func(r *shadowqueue.Record) { r.Exchange = "$JS.ACK.OTHER.worker.1.2.2.1.0" },
		"not an ack subject":     func(r *shadowqueue.Record) { r.Exchange = "_INBOX.x" },
		"headers not NATS":       func(r *shadowqueue.Record) { r.Properties = []byte("HTTP/1.1\r\n\r\n") },
		"headers unterminated":   func(r *shadowqueue.Record) { r.Properties = []byte("NATS/1.0\r\nK: v\r\n") },
	} {
		r := good
		edit(&r)
		if err := replayRecordErr(&r, k); err == nil || !strings.Contains(err.Error(), "record ID 7") {
			t.Errorf("%s: err = %v, want one that names the record", name, err)
		}
	}
}

// TestStartReplayingAfterTheSwitch: a pull request served once its
// consumer has switched does not count its connection as replaying; it
// kept a target in replay mode (absorbing the app's publishes) for good.
func TestStartReplayingAfterTheSwitch(t *testing.T) {
	p := &Proxy{rp: newReplayer(nil, nil)}
	c := newConn(p, nil, nil, nil)
	k := newKeyReplay("work", "worker")
	c.startReplaying(k)
	c.startReplaying(k)
	if got := p.rp.active.Load(); got != 1 {
		t.Fatalf("active %d after two starts, want 1", got)
	}
	k.switched = true
	c.stopReplaying(k) // what switchKey does for every connection
	c.startReplaying(k)
	if got := p.rp.active.Load(); got != 0 {
		t.Fatalf("active %d after a start on a switched key, want 0", got)
	}
}
