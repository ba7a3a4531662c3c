package natsproxy

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/natswire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// memLog keeps the records written to it.
type memLog struct {
	mu   sync.Mutex
	recs []shadowqueue.Record
}

func (m *memLog) Write(_ context.Context, rs []shadowqueue.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs = append(m.recs, rs...)
	return nil
}

func (m *memLog) Last(context.Context) (shadowqueue.Record, bool, error) {
	return shadowqueue.Record{}, false, nil
}

func (m *memLog) Close() error { return nil }

// stubServer answers a stop's questions as a server whose consumer
// delivered up to delivered (reads after the first settle there).
type stubServer struct {
	delivered []uint64 // successive answers; the last repeats
	bound     bool
	filters   []string
	msgs      map[uint64]StoredMsg
	reads     int
}

func (s *stubServer) Delivered(context.Context, string, string) (ConsumerDelivered, error) {
	d := s.delivered[min(s.reads, len(s.delivered)-1)]
	s.reads++
	return ConsumerDelivered{StreamSeq: d, Filters: s.filters, Bound: s.bound}, nil
}

func (s *stubServer) Message(_ context.Context, _ string, seq uint64) (StoredMsg, bool, error) {
	m, ok := s.msgs[seq]
	return m, ok, nil
}

func (s *stubServer) PushConsumers(context.Context) (map[string]string, error) { return nil, nil }

// voidProxy is a proxy with one connection whose app got deliveries of
// consumer C of stream S up to stream sequence seen, on push subscription
// "1" (queue: its queue group), and the log it writes.
func voidProxy(t *testing.T, srv *stubServer, seen uint64, queue string) (*Proxy, *memLog) {
	t.Helper()
	log := &memLog{}
	tee := shadowqueue.NewTee(log, shadowqueue.Record{}, shadowqueue.TeeOptions{})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { _ = tee.Run(ctx) })
	p := New(tee, Options{Recover: srv, Logger: slog.New(slog.DiscardHandler)})
	up, server := net.Pipe()
	t.Cleanup(func() { _ = up.Close(); _ = server.Close() })
	c := newConn(p, nil, up, slog.New(slog.DiscardHandler))
	c.subs["1"] = appSub{subject: "deliver.S", queue: queue}
	c.noteSeen(&deliveryNames{stream: "S", consumer: "C", key: ReplayKey("S", "C")}, seen, []byte("1"))
	p.conns[c] = struct{}{}
	return p, log
}

// TestRecoverVoidLogsWhatWentToNoOne: the server delivered past what the
// app got (3, 4 and 5 after 2; 4 is on a subject the consumer's filter
// leaves out, and reads after the first show 5, the last delivery of the
// window): the stop logs 3 and 5, in order, as deliveries of the consumer
// with ack subjects that name their stream sequences, and nothing else.
func TestRecoverVoidLogsWhatWentToNoOne(t *testing.T) {
	at := time.Unix(1700000000, 0)
	srv := &stubServer{delivered: []uint64{4, 5}, filters: []string{"work.>"}, msgs: map[uint64]StoredMsg{
		3: {Subject: "work.a", Body: []byte("m3"), Time: at},
		4: {Subject: "other.a", Body: []byte("m4"), Time: at},
		5: {Subject: "work.b", Header: []byte("NATS/1.0\r\nK: v\r\n\r\n"), Body: []byte("m5"), Time: at},
	}}
	p, log := voidProxy(t, srv, 2, "")
	n, err := p.recoverVoid(t.Context())
	if err != nil || n != 2 {
		t.Fatalf("recoverVoid = %d, %v; want 2, nil", n, err)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.recs) != 2 {
		t.Fatalf("logged %d records, want 2: %+v", len(log.recs), log.recs)
	}
	for i, want := range []struct {
		seq        uint64
		subj, body string
	}{{3, "work.a", "m3"}, {5, "work.b", "m5"}} {
		r := log.recs[i]
		ack, ok := natswire.ParseJSAck([]byte(r.Exchange))
		if !ok || string(ack.Stream) != "S" || string(ack.Consumer) != "C" || ack.StreamSeq != want.seq || ack.Delivered != 1 {
			t.Errorf("record %d: ack subject %q (%+v, %v), want one of S/C at stream sequence %d, first delivery", i, r.Exchange, ack, ok, want.seq)
		}
		if r.Queue != "S" || r.ConsumerTag != "C" || r.RoutingKey != want.subj || string(r.Body) != want.body {
			t.Errorf("record %d: %+v, want stream S, consumer C, subject %s, body %s", i, r, want.subj, want.body)
		}
	}
	if string(log.recs[1].Properties) != "NATS/1.0\r\nK: v\r\n\r\n" {
		t.Errorf("record of 5 has headers %q, want the stored ones", log.recs[1].Properties)
	}
}

// TestRecoverVoidLeavesAlone: nothing is read back when the server
// delivered nothing past what the app got, when another subscriber is
// bound to the deliver subject, or when the app's subscription has a
// queue group (its other members may have had those messages); and a
// window beyond maxRecover fails the stop.
func TestRecoverVoidLeavesAlone(t *testing.T) {
	msgs := map[uint64]StoredMsg{3: {Subject: "work.a", Body: []byte("m3")}}
	for name, tc := range map[string]struct {
		srv     *stubServer
		queue   string
		wantErr bool
	}{
		"nothing past":  {srv: &stubServer{delivered: []uint64{2}, msgs: msgs}},
		"bound":         {srv: &stubServer{delivered: []uint64{3}, bound: true, msgs: msgs}},
		"queue group":   {srv: &stubServer{delivered: []uint64{3}, msgs: msgs}, queue: "workers"},
		"beyond window": {srv: &stubServer{delivered: []uint64{2 + maxRecover + 1}, msgs: msgs}, wantErr: true},
	} {
		t.Run(name, func(t *testing.T) {
			p, log := voidProxy(t, tc.srv, 2, tc.queue)
			n, err := p.recoverVoid(t.Context())
			if (err != nil) != tc.wantErr || n != 0 {
				t.Fatalf("recoverVoid = %d, %v; want 0 and an error: %v", n, err, tc.wantErr)
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			if len(log.recs) != 0 {
				t.Errorf("logged %+v, want nothing", log.recs)
			}
		})
	}
}

func TestMatchSubject(t *testing.T) {
	for _, tc := range []struct {
		filter, subject string
		want            bool
	}{
		{"a.b", "a.b", true}, {"a.b", "a.c", false}, {"a.*", "a.b", true}, {"a.*", "a.b.c", false},
		{"a.>", "a.b.c", true}, {"a.>", "a", false}, {"*.b", "a.b", true}, {">", "a", true}, {"a.b.c", "a.b", false},
	} {
		if got := matchSubject(tc.filter, tc.subject); got != tc.want {
			t.Errorf("matchSubject(%q, %q) = %v, want %v", tc.filter, tc.subject, got, tc.want)
		}
	}
}
