package natsproxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/natswire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestTransparency runs core NATS and JetStream traffic of an unmodified
// nats.go client through the proxy against the real server: pub/sub with
// headers, request/reply and JetStream publishes with their acks. Core
// messages are teed best effort; replies to the app's requests are not.
func TestTransparency(t *testing.T) {
	h := newHarness(t)
	_, subject := h.stream(t)
	nc, js := h.app(t)
	ctx := t.Context()

	sub, err := nc.SubscribeSync("ms2m.core.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the server has the SUB
		t.Fatal(err)
	}
	m := nats.NewMsg("ms2m.core.test")
	m.Header.Set("X-Test", "yes")
	m.Data = []byte("hello")
	if err := h.nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	got, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Data) != "hello" || got.Header.Get("X-Test") != "yes" {
		t.Errorf("core message through the proxy: %q %v", got.Data, got.Header)
	}

	svc, err := h.nc.Subscribe("ms2m.svc", func(m *nats.Msg) { _ = m.Respond(append([]byte("re:"), m.Data...)) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Unsubscribe() }()
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	resp, err := nc.Request("ms2m.svc", []byte("ping"), 5*time.Second)
	if err != nil || string(resp.Data) != "re:ping" {
		t.Fatalf("request through the proxy: %v %v", resp, err)
	}

	for i := range 20 {
		if _, err := js.Publish(ctx, subject, fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	big := make([]byte, nc.MaxPayload()-200) // near max_payload: split across reads
	if _, err := js.Publish(ctx, subject, big); err != nil {
		t.Fatal(err)
	}
	st := h.proxy.Stats()
	if st.CoreTeed != 1 || st.JSDeliveries != 0 || st.AcksAbsorbed != 0 {
		t.Errorf("stats %+v: want exactly the one core message teed", st)
	}
}

// TestPullAcksWaitForTheLog is invariant I1 for pull consumers: while the
// log cannot store anything, the app's acks do not reach the server; once
// it can, they do, and the log holds every delivery with its stream, consumer,
// subject, ack subject (stream sequence), headers and body.
func TestPullAcksWaitForTheLog(t *testing.T) {
	h := newHarness(t)
	stream, subject := h.stream(t)
	ctx := t.Context()
	const n = 10
	for i := range n {
		m := nats.NewMsg(subject)
		m.Header.Set("N", fmt.Sprint(i))
		m.Data = fmt.Appendf(nil, "body-%d", i)
		if _, err := h.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "proc", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, js := h.app(t)
	cons, err := js.Consumer(ctx, stream, "proc")
	if err != nil {
		t.Fatal(err)
	}
	h.log.hold()
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got int
	for m := range batch.Messages() {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		got++
	}
	if got != n {
		t.Fatalf("fetched %d messages, want %d (%v)", got, n, batch.Error())
	}
	testenv.Eventually(t, 10*time.Second, "the proxy holds the acks", func() bool { return h.proxy.Stats().AcksWaited == n })
	// Nothing is durable, so the writer cannot have sent an ack: the server
	// must still count every message as pending an ack.
	direct, err := h.js.Consumer(ctx, stream, "proc")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
		info, err := direct.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending != n {
			t.Fatalf("an ack reached the server before its delivery was in the log: %d pending, want %d", info.NumAckPending, n)
		}
	}
	h.log.release()
	testenv.Eventually(t, 10*time.Second, "the acks reach the server once the log has the deliveries", func() bool {
		info, err := direct.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.AckFloor.Stream == n
	})
	recs, err := h.log.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n {
		t.Fatalf("log has %d records, want %d", len(recs), n)
	}
	for i, r := range recs {
		ack, ok := natswire.ParseJSAck([]byte(r.Exchange))
		if !ok || r.Kind != shadowqueue.KindDelivery || r.ID != uint64(i+1) || r.Queue != stream || r.ConsumerTag != "proc" ||
			r.RoutingKey != subject || ack.StreamSeq != uint64(i+1) || string(r.Body) != fmt.Sprintf("body-%d", i) ||
			!strings.Contains(string(r.Properties), fmt.Sprintf("N: %d\r\n", i)) {
			t.Errorf("record %d: %+v", i, r)
		}
	}
}

// TestPushConsumerWithFlowControl consumes with a durable push consumer
// (flow control and idle heartbeats on) through the proxy: every message
// arrives once, every ack reaches the server, and the log holds exactly the
// deliveries (no status message).
func TestPushConsumerWithFlowControl(t *testing.T) {
	h := newHarness(t)
	stream, subject := h.stream(t)
	ctx := t.Context()
	const n = 500
	for i := range n {
		if _, err := h.js.PublishAsync(subject, fmt.Appendf(nil, "p%d", i), jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-h.js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	nc, _ := h.app(t)
	legacy, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, n)
	sub, err := legacy.Subscribe(subject, func(m *nats.Msg) {
		seen <- string(m.Data)
		_ = m.Ack()
	}, nats.Durable("pusher"), nats.ManualAck(), nats.EnableFlowControl(), nats.IdleHeartbeat(200*time.Millisecond),
		nats.AckExplicit(), nats.DeliverAll(), nats.MaxAckPending(64))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	got := map[string]bool{}
	for len(got) < n {
		select {
		case s := <-seen:
			if got[s] {
				t.Fatalf("message %s delivered twice", s)
			}
			got[s] = true
		case <-time.After(20 * time.Second):
			t.Fatalf("got %d of %d messages", len(got), n)
		}
	}
	direct, err := h.nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "every ack reaches the server", func() bool {
		ci, err := direct.ConsumerInfo(stream, "pusher")
		return err == nil && ci.NumAckPending == 0 && ci.AckFloor.Stream == n
	})
	recs, err := h.log.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n {
		t.Fatalf("log has %d records, want %d", len(recs), n)
	}
	st := h.proxy.Stats()
	if st.JSDeliveries != n || st.Acks != n || st.AcksAbsorbed != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestAckOfAnotherSidecarsDeliveryIsAbsorbed: an ack for a delivery that
// this proxy did not hand out (as after a sidecar restart) does not reach
// the server, which redelivers the message; the redelivery is teed and its
// ack goes through.
func TestAckOfAnotherSidecarsDeliveryIsAbsorbed(t *testing.T) {
	h := newHarness(t)
	stream, subject := h.stream(t)
	ctx := t.Context()
	if _, err := h.js.Publish(ctx, subject, []byte("once")); err != nil {
		t.Fatal(err)
	}
	cons, err := h.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "proc", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Fetched directly: the proxy never saw this delivery.
	b, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var reply string
	for m := range b.Messages() {
		reply = m.Reply()
	}
	if reply == "" {
		t.Fatalf("no message: %v", b.Error())
	}
	nc, js := h.app(t)
	if err := nc.Publish(reply, []byte("+ACK")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if st := h.proxy.Stats(); st.AcksAbsorbed != 1 || st.Acks != 0 {
		t.Fatalf("stats %+v: want the ack absorbed", st)
	}
	pc, err := js.Consumer(ctx, stream, "proc")
	if err != nil {
		t.Fatal(err)
	}
	b, err = pc.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range b.Messages() {
		md, _ := m.Metadata()
		if md.NumDelivered != 2 || string(m.Data()) != "once" {
			t.Errorf("redelivery: delivered %d, %q", md.NumDelivered, m.Data())
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("got %d redeliveries, want 1 (%v)", n, b.Error())
	}
	testenv.Eventually(t, 10*time.Second, "the redelivery's ack reaches the server", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.AckFloor.Stream == 1
	})
	recs, err := h.log.ReadAll(ctx)
	if err != nil || len(recs) != 1 || !recs[0].Redelivered {
		t.Fatalf("log: %d records, %v; want the one redelivery", len(recs), err)
	}
}

// TestAckAfterAnUpstreamCutReachesTheServer: the proxy's connection to the
// server is cut while the app holds a delivery; the connection ends on the
// app's side too, nats.go reconnects through the proxy and sends the ack
// it buffered meanwhile on its new connection. The ack reaches the server:
// the message is not delivered again after the consumer's ack wait. Before,
// the proxy forgot the deliveries of the connection that ended and
// absorbed the ack, and the app got the message twice.
func TestAckAfterAnUpstreamCutReachesTheServer(t *testing.T) {
	h := newRelayedHarness(t)
	stream, subject := h.stream(t)
	ctx := t.Context()
	const ackWait = 3 * time.Second
	cons, err := h.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "proc", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	disconnected, reconnected := make(chan struct{}, 8), make(chan struct{}, 8)
	_, js := h.app(t, nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0), nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { disconnected <- struct{}{} }),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	pc, err := js.Consumer(ctx, stream, "proc")
	if err != nil {
		t.Fatal(err)
	}
	deliveries := make(chan jetstream.Msg, 16)
	cc, err := pc.Consume(func(m jetstream.Msg) { deliveries <- m }) // acked by the test, not here
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	if _, err := h.js.Publish(ctx, subject, []byte("once")); err != nil {
		t.Fatal(err)
	}
	var held jetstream.Msg
	select {
	case held = <-deliveries:
	case <-time.After(10 * time.Second):
		t.Fatal("the message did not reach the app")
	}
	if n := h.relay.Cut(); n == 0 {
		t.Fatal("no upstream connection to cut")
	}
	select {
	case <-disconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("the app did not see its connection end after the upstream cut")
	}
	if err := held.Ack(); err != nil { // buffered by nats.go until it is back
		t.Fatalf("ack while reconnecting: %v", err)
	}
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("the app did not reconnect through the proxy")
	}
	// Every delivery, by stream sequence, until the ack wait has passed
	// twice over the ack's arrival.
	count := map[uint64]int{}
	window := time.After(2*ackWait + time.Second)
collect:
	for {
		select {
		case m := <-deliveries:
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			count[md.Sequence.Stream]++
		case <-window:
			break collect
		}
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := h.proxy.Stats()
	if len(count) != 0 || ci.NumAckPending != 0 || ci.AckFloor.Stream != 1 {
		t.Errorf("after the ack on the new connection: redeliveries by stream sequence %v, %d pending an ack, ack floor %d; want none, 0, 1 (the server never got the ack; proxy stats %+v)",
			count, ci.NumAckPending, ci.AckFloor.Stream, st)
	}
	if st.Acks != 1 || st.AcksAbsorbed != 0 {
		t.Errorf("proxy stats %+v: want the one ack forwarded, none absorbed", st)
	}
}

// TestTLSServerRefused: a server that requires TLS is refused with a -ERR
// that says so, rather than proxied blind.
func TestTLSServerRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte(`INFO {"server_id":"S","tls_required":true}` + "\r\n"))
		_, _ = bufio.NewReader(c).ReadString('\n')
	}()
	p := New(shadowqueue.NewTee(nil, shadowqueue.Record{}, shadowqueue.TeeOptions{}), Options{Upstream: ln.Addr().String()})
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, pl) }()
	defer func() { cancel(); <-done }()
	c, err := net.Dial("tcp", pl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "-ERR ") || !strings.Contains(line, "requires TLS") {
		t.Errorf("got %q, %v; want a -ERR about TLS", line, err)
	}
}

// TestINFOClusterURLsStripped: a server that advertises cluster URLs (a
// stand-in that speaks only INFO: the local nats-server is no cluster)
// reaches the app without them, whether the INFO arrives whole or split.
func TestINFOClusterURLsStripped(t *testing.T) {
	for _, split := range []int{0, 7} {
		t.Run(fmt.Sprint("split", split), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			info := `INFO {"server_id":"S","max_payload":1048576,"connect_urls":["10.1.2.3:4222"],"ws_connect_urls":["10.1.2.3:80"]}` + "\r\nPING\r\n"
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				b := []byte(info)
				for len(b) > 0 {
					k := len(b)
					if split > 0 {
						k = min(split, len(b))
					}
					if _, err := c.Write(b[:k]); err != nil {
						return
					}
					b = b[k:]
				}
				_, _ = bufio.NewReader(c).ReadString('\n')
			}()
			tee := shadowqueue.NewTee(nil, shadowqueue.Record{}, shadowqueue.TeeOptions{})
			p := New(tee, Options{Upstream: ln.Addr().String()})
			pl, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- p.Serve(ctx, pl) }()
			defer func() { cancel(); <-done }()
			c, err := net.Dial("tcp", pl.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			r := bufio.NewReader(c)
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if want := `INFO {"max_payload":1048576,"server_id":"S"}` + "\r\n"; line != want {
				t.Errorf("INFO through the proxy:\n got %q\nwant %q", line, want)
			}
			if line, err = r.ReadString('\n'); err != nil || line != "PING\r\n" {
				t.Errorf("next line %q, %v; want the PING byte for byte", line, err)
			}
			if p.Stats().INFOStripped != 1 {
				t.Errorf("stats %+v", p.Stats())
			}
		})
	}
}
