package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/amqpwire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// The tests in this file drive one proxied connection over net.Pipe: the
// test plays the app on one end and the broker on the other, both speaking
// through amqpwire's codec, and checks what the proxy lets through in each
// mode. No broker is involved; the sidecar suite covers the real one.

// memTee is a replay log in memory: every record is durable at once.
type memTee struct {
	mu      sync.Mutex
	recs    []shadowqueue.Record
	markers []shadowqueue.Kind
	last    uint64
	epoch   uint64
	// cutoffQueues holds the queues each AppendCutoff named.
	cutoffQueues [][]string
}

func (t *memTee) Append(r shadowqueue.Record) (uint64, shadowqueue.Ticket) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last++
	r.ID = t.last
	t.recs = append(t.recs, r)
	return t.last, shadowqueue.Ticket(t.last)
}

func (t *memTee) AppendMarker(k shadowqueue.Kind) (id, epoch uint64, tk shadowqueue.Ticket) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if k == shadowqueue.KindCutoff {
		t.epoch++
	}
	t.markers = append(t.markers, k)
	return t.last, t.epoch, shadowqueue.Ticket(t.last)
}

func (t *memTee) AppendCutoff(queues []string) (id, epoch uint64, tk shadowqueue.Ticket) {
	t.mu.Lock()
	t.cutoffQueues = append(t.cutoffQueues, queues)
	t.mu.Unlock()
	return t.AppendMarker(shadowqueue.KindCutoff)
}

func (t *memTee) Durable(shadowqueue.Ticket) bool                { return true }
func (t *memTee) Wait(context.Context, shadowqueue.Ticket) error { return nil }
func (t *memTee) WaitRoom(context.Context) error                 { return nil }

func (t *memTee) Status() shadowqueue.TeeStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	return shadowqueue.TeeStatus{LastID: t.last, ConfirmedID: t.last, Epoch: t.epoch}
}

func (t *memTee) Continue(last, epoch uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last, t.epoch = last, epoch
	return nil
}

func (t *memTee) AppendPublish(uint64, string, string, []byte) shadowqueue.Ticket { return 0 }

func (t *memTee) records() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.recs)
}

// memSource is a replay source holding the records of one finished
// source: Next reports done past the last one.
type memSource struct {
	recs   map[string][]shadowqueue.Record
	cutoff uint64
}

func (s *memSource) Next(_ context.Context, queue string, i int) (shadowqueue.Record, bool, error) {
	if i < len(s.recs[queue]) {
		return s.recs[queue][i], false, nil
	}
	return shadowqueue.Record{}, true, nil
}

func (s *memSource) Cutoff() (id, epoch uint64, ok bool) { return s.cutoff, 1, true }

// wireFrame is one frame read off a pipe end, decoded where amqpwire can.
type wireFrame struct {
	typ     uint8
	channel uint16
	method  amqpwire.Method // nil unless a method frame amqpwire decodes
	payload []byte
}

func (f wireFrame) String() string {
	switch {
	case f.method != nil:
		return fmt.Sprintf("ch%d %T%+v", f.channel, f.method, f.method)
	case f.typ == amqpwire.FrameHeader:
		return fmt.Sprintf("ch%d header", f.channel)
	case f.typ == amqpwire.FrameBody:
		return fmt.Sprintf("ch%d body %q", f.channel, f.payload)
	}
	return fmt.Sprintf("ch%d frame type %d", f.channel, f.typ)
}

// peer is the test's end of one pipe: it reads every frame the proxy
// writes, so that the proxy never blocks on it, and writes frames.
type peer struct {
	t      *testing.T
	name   string
	conn   net.Conn
	frames chan wireFrame
}

func newPeer(t *testing.T, name string, nc net.Conn, header bool) *peer {
	pe := &peer{t: t, name: name, conn: nc, frames: make(chan wireFrame, 1024)}
	go func() {
		defer close(pe.frames)
		if header {
			hdr := make([]byte, len(amqpwire.ProtocolHeader))
			if _, err := io.ReadFull(nc, hdr); err != nil {
				return
			}
		}
		p := amqpwire.NewParser(0)
		buf := make([]byte, 64<<10)
		for {
			n, err := nc.Read(buf)
			perr := p.Parse(buf[:n], func(f amqpwire.Frame) error {
				wf := wireFrame{typ: f.Type, channel: f.Channel, payload: append([]byte(nil), f.Payload...)}
				if f.Type == amqpwire.FrameMethod {
					wf.method, _ = amqpwire.DecodeMethod(f.Payload)
				}
				pe.frames <- wf
				return nil
			})
			if err != nil || perr != nil {
				return
			}
		}
	}()
	return pe
}

// send writes method frames on channel 1.
func (pe *peer) send(ms ...amqpwire.Method) {
	pe.t.Helper()
	var b []byte
	for _, m := range ms {
		b = amqpwire.AppendMethodFrame(b, 1, m)
	}
	pe.write(b)
}

func (pe *peer) write(b []byte) {
	pe.t.Helper()
	if _, err := pe.conn.Write(b); err != nil {
		pe.t.Fatalf("%s: write: %v", pe.name, err)
	}
}

// sendContent writes a content-bearing method m on channel 1 with body.
func (pe *peer) sendContent(m amqpwire.Method, body string) {
	pe.t.Helper()
	b := amqpwire.AppendMethodFrame(nil, 1, m)
	b = amqpwire.AppendRawHeaderFrame(b, 1, amqpwire.ClassBasic, uint64(len(body)), []byte{0, 0})
	b = amqpwire.AppendBodyFrames(b, 1, []byte(body), 0)
	pe.write(b)
}

// next returns the next frame the proxy wrote to this end.
func (pe *peer) next() wireFrame {
	pe.t.Helper()
	select {
	case f, ok := <-pe.frames:
		if !ok {
			pe.t.Fatalf("%s: the proxy closed the connection", pe.name)
		}
		return f
	case <-time.After(5 * time.Second):
		pe.t.Fatalf("%s: no frame from the proxy within 5s", pe.name)
	}
	return wireFrame{}
}

// expect reads the next frame and fails unless it is a method of type T.
func expect[T amqpwire.Method](pe *peer) T {
	pe.t.Helper()
	f := pe.next()
	m, ok := f.method.(T)
	if !ok {
		var zero T
		pe.t.Fatalf("%s got %v, want %T", pe.name, f, zero)
	}
	return m
}

// expectContent reads a basic.deliver or basic.get-ok with its header and
// body frames and returns the method and the body.
func expectContent[T amqpwire.Method](pe *peer) (T, string) {
	pe.t.Helper()
	m := expect[T](pe)
	if h := pe.next(); h.typ != amqpwire.FrameHeader {
		pe.t.Fatalf("%s got %v, want a content header", pe.name, h)
	}
	b := pe.next()
	if b.typ != amqpwire.FrameBody {
		pe.t.Fatalf("%s got %v, want a body frame", pe.name, b)
	}
	return m, string(b.payload)
}

// barrier proves that nothing the proxy would have written before it is
// on its way: it sends a channel.flow from the other end, which the proxy
// passes through in order, and fails if any other frame comes first.
func barrier(from, to *peer) {
	to.t.Helper()
	from.send(&amqpwire.ChannelFlow{Active: true})
	f := to.next()
	if _, ok := f.method.(*amqpwire.ChannelFlow); !ok {
		to.t.Fatalf("%s got %v before the barrier, want nothing", to.name, f)
	}
}

// pipeProxy is a proxy with one connection between the test's app and
// broker ends.
type pipeProxy struct {
	p           *Proxy
	c           *conn
	tee         *memTee
	app, broker *peer
}

func startPipe(t *testing.T, opts Options) *pipeProxy {
	t.Helper()
	tee := &memTee{}
	opts.Logger = slog.New(slog.DiscardHandler)
	pp := attachPipe(t, New(tee, opts))
	pp.tee = tee
	return pp
}

// attachPipe opens one more connection through p.
func attachPipe(t *testing.T, p *Proxy) *pipeProxy {
	t.Helper()
	appEnd, proxyApp := net.Pipe()
	proxyUp, brokerEnd := net.Pipe()
	p.mu.Lock()
	p.nextID++
	c := newConn(p, p.nextID, proxyApp, proxyUp, p.log)
	c.mode = p.mode
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx)
	}()
	pp := &pipeProxy{p: p, c: c,
		app:    newPeer(t, "app", appEnd, false),
		broker: newPeer(t, "broker", brokerEnd, true)}
	t.Cleanup(func() {
		cancel()
		appEnd.Close()
		brokerEnd.Close()
		<-done
	})
	pp.app.write(amqpwire.ProtocolHeader)
	return pp
}

// consume sets up the app's consumer "c1" of queue "q" on channel 1, as
// the broker confirms it.
func (pp *pipeProxy) consume(t *testing.T) {
	t.Helper()
	pp.app.send(&amqpwire.BasicConsume{Queue: "q", ConsumerTag: "c1"})
	if m := expect[*amqpwire.BasicConsume](pp.broker); m.ConsumerTag != "c1" {
		t.Fatalf("broker got consume %+v, want tag c1", m)
	}
	pp.broker.send(&amqpwire.BasicConsumeOk{ConsumerTag: "c1"})
	expect[*amqpwire.BasicConsumeOk](pp.app)
}

// deliver has the broker deliver tag on consumer c1.
func (pp *pipeProxy) deliver(tag uint64, body string) {
	pp.broker.sendContent(&amqpwire.BasicDeliver{ConsumerTag: "c1", DeliveryTag: tag, RoutingKey: "q"}, body)
}

// expectDelivery reads a delivery at the app and checks its tag and body.
func (pp *pipeProxy) expectDelivery(t *testing.T, tag uint64, body string) {
	t.Helper()
	m, got := expectContent[*amqpwire.BasicDeliver](pp.app)
	if m.DeliveryTag != tag || got != body {
		t.Fatalf("app got delivery tag %d body %q, want tag %d body %q", m.DeliveryTag, got, tag, body)
	}
}

// expectAck reads the next frame at the broker and checks it acks tag.
func (pp *pipeProxy) expectAck(t *testing.T, tag uint64) {
	t.Helper()
	if m := expect[*amqpwire.BasicAck](pp.broker); m.DeliveryTag != tag {
		t.Fatalf("broker got ack of tag %d, want %d", m.DeliveryTag, tag)
	}
}

// waitFor polls cond until it holds or 5 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// async runs fn in a goroutine and returns its error on a channel.
func async(fn func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	return ch
}

func result(t *testing.T, what string, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not return within 5s", what)
	}
}

// TestPipeServing: while serving, a delivery goes to the app as the broker
// sent it and into the log, and the app's ack goes to the broker.
func TestPipeServing(t *testing.T) {
	pp := startPipe(t, Options{})
	pp.consume(t)
	pp.deliver(1, "one")
	pp.expectDelivery(t, 1, "one")
	if n := pp.tee.records(); n != 1 {
		t.Fatalf("log holds %d records, want 1", n)
	}
	pp.app.send(&amqpwire.BasicAck{DeliveryTag: 1})
	pp.expectAck(t, 1)
}

// TestPipeQuiesceHoldsDeliveries: Quiesce waits for the app's ack of what
// it has, which still goes to the broker, and holds new deliveries back
// from the app (and out of the log).
func TestPipeQuiesceHoldsDeliveries(t *testing.T) {
	pp := startPipe(t, Options{})
	pp.consume(t)
	pp.deliver(1, "one")
	pp.expectDelivery(t, 1, "one")

	quiesced := async(func() error { _, _, err := pp.p.Quiesce(t.Context()); return err })
	waitFor(t, "the proxy is quiesced", func() bool { return pp.p.Mode() == Quiesced })
	pp.deliver(2, "two")
	barrier(pp.broker, pp.app) // the delivery of tag 2 did not come before it
	if st := pp.p.State(); st.Held != 1 {
		t.Fatalf("State().Held = %d, want 1", st.Held)
	}
	if n := pp.tee.records(); n != 1 {
		t.Fatalf("log holds %d records, want 1: a held delivery is not the app's yet", n)
	}
	select {
	case err := <-quiesced:
		t.Fatalf("Quiesce returned (%v) while the app had a delivery unacked", err)
	default:
	}
	pp.app.send(&amqpwire.BasicAck{DeliveryTag: 1})
	pp.expectAck(t, 1)
	result(t, "Quiesce", quiesced)
}

// TestPipeResumeHandsHeld: Resume after a quiesce hands the held
// deliveries to the app in order, and later ones pass again.
func TestPipeResumeHandsHeld(t *testing.T) {
	pp := startPipe(t, Options{})
	pp.consume(t)
	result(t, "Quiesce", async(func() error { _, _, err := pp.p.Quiesce(t.Context()); return err }))
	pp.deliver(1, "one")
	pp.deliver(2, "two")
	barrier(pp.broker, pp.app)

	result(t, "Resume", async(func() error { return pp.p.Resume(t.Context()) }))
	pp.expectDelivery(t, 1, "one")
	pp.expectDelivery(t, 2, "two")
	pp.deliver(3, "three")
	pp.expectDelivery(t, 3, "three")
	if n := pp.tee.records(); n != 3 {
		t.Fatalf("log holds %d records, want 3", n)
	}
	pp.app.send(&amqpwire.BasicAck{DeliveryTag: 3, Multiple: true})
	pp.expectAck(t, 3)
}

// TestPipeStop: Stop cancels the app's consumer at the broker (the
// cancel-ok is the sidecar's, not the app's), gives the app what was held,
// and writes the cutoff once the app acked it. While stopped, the app's
// basic.consume is answered by the sidecar and kept, and its basic.get
// gets get-empty; Resume issues the kept consumes again.
func TestPipeStop(t *testing.T) {
	pp := startPipe(t, Options{})
	pp.consume(t)
	result(t, "Quiesce", async(func() error { _, _, err := pp.p.Quiesce(t.Context()); return err }))
	pp.deliver(1, "held")
	barrier(pp.broker, pp.app)

	var res StopResult
	stopped := async(func() (err error) { res, err = pp.p.Stop(t.Context()); return err })
	if m := expect[*amqpwire.BasicCancel](pp.broker); m.ConsumerTag != "c1" {
		t.Fatalf("broker got cancel %+v, want c1's", m)
	}
	pp.broker.send(&amqpwire.BasicCancelOk{ConsumerTag: "c1"})
	pp.expectDelivery(t, 1, "held") // the held delivery, after the cancel-ok (which the app does not see)
	pp.app.send(&amqpwire.BasicAck{DeliveryTag: 1})
	pp.expectAck(t, 1)
	result(t, "Stop", stopped)
	if res.CutoffID != 1 || res.Held != 1 {
		t.Fatalf("Stop = %+v, want cutoff ID 1 and 1 held", res)
	}
	if got := pp.tee.markers; len(got) != 1 || got[0] != shadowqueue.KindCutoff {
		t.Fatalf("log markers = %v, want one cutoff", got)
	}

	// Stopped: the sidecar answers consumes and gets itself.
	pp.app.send(&amqpwire.BasicConsume{Queue: "q2", ConsumerTag: "c2"})
	if m := expect[*amqpwire.BasicConsumeOk](pp.app); m.ConsumerTag != "c2" {
		t.Fatalf("app got consume-ok %+v, want c2", m)
	}
	pp.app.send(&amqpwire.BasicGet{Queue: "q"})
	expect[*amqpwire.BasicGetEmpty](pp.app)
	barrier(pp.app, pp.broker) // neither went to the broker

	// Resume consumes again, with both consumers; their consume-oks are the
	// sidecar's.
	result(t, "Resume", async(func() error { return pp.p.Resume(t.Context()) }))
	tags := map[string]bool{}
	for range 2 {
		m := expect[*amqpwire.BasicConsume](pp.broker)
		tags[m.ConsumerTag] = true
		pp.broker.send(&amqpwire.BasicConsumeOk{ConsumerTag: m.ConsumerTag})
	}
	if !tags["c1"] || !tags["c2"] {
		t.Fatalf("broker got consumes %v after Resume, want c1 and c2", tags)
	}
	barrier(pp.broker, pp.app) // the consume-oks did not reach the app
	pp.deliver(2, "after")
	pp.expectDelivery(t, 2, "after")
}

// TestPipeStopCancelsLateConsume: a consume the broker confirms after the
// stop began is cancelled too, and the stop waits for that.
func TestPipeStopCancelsLateConsume(t *testing.T) {
	pp := startPipe(t, Options{})
	pp.app.send(&amqpwire.BasicConsume{Queue: "q", ConsumerTag: "c1"})
	expect[*amqpwire.BasicConsume](pp.broker)
	stopped := async(func() error { _, err := pp.p.Stop(t.Context()); return err })
	waitFor(t, "the proxy is stopped", func() bool { return pp.p.Mode() == Stopped })
	pp.broker.send(&amqpwire.BasicConsumeOk{ConsumerTag: "c1"})
	expect[*amqpwire.BasicConsumeOk](pp.app)
	if m := expect[*amqpwire.BasicCancel](pp.broker); m.ConsumerTag != "c1" {
		t.Fatalf("broker got cancel %+v, want c1's", m)
	}
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) before the broker confirmed its cancel", err)
	default:
	}
	pp.broker.send(&amqpwire.BasicCancelOk{ConsumerTag: "c1"})
	result(t, "Stop", stopped)
}

// TestPipeReplay: on a target, the app's consume is served from the log
// (the broker sees none of it) with tags from 1, its acks of replayed
// deliveries and its publishes stay in the sidecar, and once it acked every
// record the sidecar consumes from the broker; the broker's deliveries
// then reach the app renumbered after the replayed ones, and the app's
// acks reach the broker with the broker's tags.
func TestPipeReplay(t *testing.T) {
	src := &memSource{cutoff: 2, recs: map[string][]shadowqueue.Record{"q": {
		{ID: 1, Queue: "q", RoutingKey: "q", Body: []byte("r1")},
		{ID: 2, Queue: "q", RoutingKey: "q", Body: []byte("r2")},
	}}}
	pp := startPipe(t, Options{Replay: src})
	pp.app.send(&amqpwire.BasicQos{PrefetchCount: 1})
	expect[*amqpwire.BasicQos](pp.broker)
	pp.app.send(&amqpwire.BasicConsume{Queue: "q", ConsumerTag: "c1"})
	expect[*amqpwire.BasicConsumeOk](pp.app)
	pp.expectDelivery(t, 1, "r1")
	barrier(pp.broker, pp.app) // prefetch 1: r2 waits for the ack

	// A publish while replaying is absorbed: the source made it already.
	pp.app.sendContent(&amqpwire.BasicPublish{Exchange: "x", RoutingKey: "out"}, "result")
	pp.app.send(&amqpwire.BasicAck{DeliveryTag: 1})
	pp.expectDelivery(t, 2, "r2")
	pp.app.send(&amqpwire.BasicAck{DeliveryTag: 2})

	// Every record acked: the sidecar consumes the queue upstream.
	if m := expect[*amqpwire.BasicConsume](pp.broker); m.Queue != "q" || m.ConsumerTag != "c1" {
		t.Fatalf("broker got %+v, want the app's consume of q as c1 (nothing before it)", m)
	}
	pp.broker.send(&amqpwire.BasicConsumeOk{ConsumerTag: "c1"})
	pp.deliver(1, "live")
	pp.expectDelivery(t, 3, "live") // renumbered after the replayed ones
	pp.app.send(&amqpwire.BasicAck{DeliveryTag: 3})
	pp.expectAck(t, 1)
	st := pp.p.State()
	if st.Replay == nil || st.Replay.Replayed != 2 || len(st.Replay.Switched) != 1 {
		t.Fatalf("State().Replay = %+v, want 2 replayed and q switched", st.Replay)
	}
	if len(st.Replay.Suppressed) != 1 || st.Replay.Suppressed[0].Count != 1 {
		t.Fatalf("State().Replay.Suppressed = %+v, want the one absorbed publish", st.Replay.Suppressed)
	}
}
