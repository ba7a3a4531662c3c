package natsproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ms2m/ms2m/internal/natswire"
	"github.com/ms2m/ms2m/internal/proxy"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// readBufSize is the size of each pump's read buffer.
const readBufSize = 64 << 10

// chunk is a run of the app's bytes for the server, in order. gate says
// which log record must be durable before it is written (gated).
type chunk struct {
	data  []byte
	gate  shadowqueue.Ticket
	gated bool
	pings int // PINGs in data
}

// conn is one proxied connection.
type conn struct {
	p   *Proxy
	app net.Conn
	up  net.Conn
	log *slog.Logger

	upMu  sync.Mutex // serialises writes to up: the writer and PONGs
	queue chan chunk // the app's bytes, in order, for the writer

	// maxPayload is the server's max_payload, as its INFO announced;
	// both parsers follow it. Read and written by the downstream pump
	// only, then told to the upstream pump through payloadCh.
	payloadCh chan int

	abortOnce sync.Once
	aborted   chan struct{}

	// origin stands for this connection in the proxy's unackedSet: the
	// deliveries that came on it are awaited until it ends.
	origin *connOrigin

	// mu guards the app side of the downstream direction: the mode this
	// connection acts on, the deliveries it holds back, and writes to app.
	mu      sync.Mutex
	mode    proxy.Mode
	held    [][]byte // JetStream deliveries held back while quiesced, raw
	dropped int      // deliveries dropped while stopped
	// jsSIDs are the app's subscriptions that got JetStream deliveries:
	// a stop takes them off the server.
	jsSIDs map[string]bool
	// seen is, per JetStream consumer (ReplayKey), the last delivery this
	// connection handed the app (guarded by mu): what a stop compares
	// with the server's delivered sequence (void.go).
	seen map[string]*seenConsumer
	// lastNames are the last delivery's strings (names).
	lastNames deliveryNames
	// block is where the teed deliveries' headers and bodies are copied
	// (keep), guarded by mu.
	block []byte
	// downAt is when the server's bytes being parsed were read (downClock).
	downAt time.Time
	// upAt is the same for the app's bytes, read and written by the
	// upstream pump only (upClock).
	upAt time.Time

	// queued counts the app's chunks not yet written to the server.
	queued atomic.Int64

	// subMu guards the app's subscriptions and, on a target, the replay
	// this connection takes part in.
	subMu     sync.Mutex
	subs      map[string]appSub    // by sid
	feeds     map[string]*pushFeed // held subscriptions fed from the log, by sid
	replaying map[*keyReplay]bool  // consumers served from the log here
	// pulled holds the pull consumers (ReplayKey) the app asked for
	// messages, at most maxSubs: a stop's cutoff marker names them.
	pulled map[string]bool
	// replaySettled counts the replayed deliveries the app settled here.
	replaySettled atomic.Uint64

	// PINGs written to the server (guarded by upMu) and PONGs read back
	// (downstream pump): a flush of the proxy's own waits for the PONG of
	// its PING, which does not go to the app.
	pingsSent uint64
	pongsSeen uint64
	flushMu   sync.Mutex
	flushAt   uint64        // the PONG number a flush waits for, 0 none
	flushed   chan struct{} // closed when it comes
}

func newConn(p *Proxy, app, up net.Conn, log *slog.Logger) *conn {
	return &conn{
		p: p, app: app, up: up, log: log,
		queue:     make(chan chunk, 64),
		payloadCh: make(chan int, 1),
		aborted:   make(chan struct{}),
		origin:    &connOrigin{},
		subs:      map[string]appSub{},
		jsSIDs:    map[string]bool{},
		seen:      map[string]*seenConsumer{},
		feeds:     map[string]*pushFeed{},
		replaying: map[*keyReplay]bool{},
	}
}

// abort closes both sides at once.
func (c *conn) abort() {
	c.abortOnce.Do(func() {
		close(c.aborted)
		_ = c.app.Close() // tearing down: nothing left to report to
		_ = c.up.Close()
	})
}

// run pumps both directions until either side ends, and closes both.
func (c *conn) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, c.abort)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		err := c.downstream(ctx) // never nil: it runs until a side fails
		if !c.isAborted() {
			c.log.Info("NATS connection ended: server side", "err", err)
		}
		c.abort()
	})
	wg.Go(func() {
		err := c.upstream(ctx)
		if err != nil && !c.isAborted() {
			c.log.Info("NATS connection ended: app side", "err", err)
		}
		c.abort()
	})
	wg.Wait()
	c.endReplay()
}

func (c *conn) isAborted() bool {
	select {
	case <-c.aborted:
		return true
	default:
		return false
	}
}

// downstream reads from the server and writes to the app. It writes whole
// messages only (copied into out), so that an INFO can be rewritten even
// when it arrives split across reads, and a delivery reaches the app only
// once it is in the tee.
func (c *conn) downstream(ctx context.Context) error {
	parser := natswire.NewParser(0)
	buf := make([]byte, readBufSize)
	var out []byte
	for {
		if err := c.p.tee.WaitRoom(ctx); err != nil {
			return err
		}
		n, rerr := c.up.Read(buf)
		if n > 0 {
			var err error
			if out, err = c.passDown(parser, buf[:n], out[:0]); err != nil {
				return err
			}
			if cap(out) > 4*readBufSize {
				out = nil // one big message grew it: do not keep it
			}
		}
		if rerr != nil {
			return rerr
		}
	}
}

// passDown parses one read from the server (data) and writes to the app,
// in one write, what of it goes there (appended to out, which it returns
// for the next read).
func (c *conn) passDown(parser *natswire.Parser, data, out []byte) ([]byte, error) {
	c.mu.Lock()
	c.downAt = time.Time{}
	err := parser.Parse(data, func(m *natswire.Msg) error {
		switch m.Op {
		case natswire.OpInfo:
			info, changed, err := c.onInfo(m, parser)
			if err != nil {
				return err
			}
			if changed {
				out = natswire.AppendInfo(out, info)
				return nil
			}
		case natswire.OpPong:
			if c.onPong() {
				return nil // the answer to the proxy's own PING
			}
		case natswire.OpMsg, natswire.OpHMsg:
			ack, js := jsDelivery(m)
			if js && !c.jsSIDs[string(m.SID)] && len(c.jsSIDs) < maxSubs {
				c.jsSIDs[string(m.SID)] = true
			}
			if js && c.noTeeYet() {
				// A target before the cutoff is known: the delivery
				// cannot be numbered yet. The server redelivers it.
				c.dropped++
				return nil
			}
			if c.mode != proxy.Serving && js {
				if c.mode == proxy.Quiesced {
					c.held = append(c.held, bytes.Clone(m.Raw))
				} else {
					c.dropped++
				}
				return nil
			}
			if js && c.isReplayedRedelivery(ack) {
				// The app has this message from the replay: the
				// server gives it again because the source's app
				// died holding it. It is acked here, not handed
				// over again.
				if err := c.absorbRedelivery(m); err != nil {
					return err
				}
				out = c.releasePullSlot(m, out)
				return nil
			}
			if err := c.teeMsg(m, ack, js); err != nil {
				return err
			}
		}
		out = append(out, m.Raw...)
		return nil
	})
	if err != nil {
		c.mu.Unlock()
		c.refuseApp(err)
		return out, err
	}
	if len(out) > 0 {
		if _, err := c.app.Write(out); err != nil {
			c.mu.Unlock()
			return out, err
		}
	}
	c.mu.Unlock()
	return out, nil
}

// refuseApp tells the app why its connection ends, as a server would. The
// caller does not hold c.mu.
func (c *conn) refuseApp(err error) {
	var perr *natswire.Error
	text := "ms2m sidecar: " + err.Error()
	if errors.As(err, &perr) {
		text = "ms2m sidecar: " + perr.Msg
	}
	c.mu.Lock() // not in the middle of a message the downstream pump writes
	defer c.mu.Unlock()
	_, _ = c.app.Write(natswire.AppendErr(nil, text)) // best effort: the connection closes next
}

// onInfo follows the server's max_payload and returns the INFO's JSON
// without the cluster URLs, and whether it removed any.
func (c *conn) onInfo(m *natswire.Msg, parser *natswire.Parser) ([]byte, bool, error) {
	info, err := natswire.ParseInfo(m.Args)
	if err != nil {
		return nil, false, err
	}
	if info.TLSRequired {
		// The app would start a TLS handshake the proxy cannot look into.
		return nil, false, errors.New("the NATS server requires TLS, which the sidecar does not proxy yet (see docs/nats.md)")
	}
	parser.SetMaxPayload(info.MaxPayload)
	select {
	case <-c.payloadCh:
	default:
	}
	c.payloadCh <- info.MaxPayload
	stripped, changed, err := natswire.StripClusterURLs(m.Args)
	if err != nil {
		return nil, false, err
	}
	if changed {
		c.p.infoStripped.Add(1)
	}
	return stripped, changed, nil
}

// onMsg tees a MSG or HMSG on its way to the app. The caller holds c.mu.
func (c *conn) onMsg(m *natswire.Msg) error {
	c.downAt = time.Time{}
	ack, js := jsDelivery(m)
	return c.teeMsg(m, ack, js)
}

// teeMsg is onMsg for a message whose ack subject jsDelivery has read.
func (c *conn) teeMsg(m *natswire.Msg, ack natswire.JSAck, js bool) error {
	if !js && isStatus(m) {
		return nil // flow control, idle heartbeat, pull status: untouched
	}
	if !js {
		if bytes.HasPrefix(m.Subject, []byte("_INBOX.")) || bytes.HasPrefix(m.Subject, []byte("$")) {
			return nil // a reply to a request of the app's
		}
		if len(m.Subject) > maxName || len(m.Reply) > maxName || c.noTeeYet() {
			return nil // best effort: a record cannot carry it, or not yet
		}
		c.p.tee.Append(shadowqueue.Record{
			RoutingKey: string(m.Subject), Exchange: string(m.Reply),
			Properties: c.keep(m.Header), Body: c.keep(m.Body),
		})
		c.p.coreTeed.Add(1)
		return nil
	}
	if len(m.Subject) > maxName || len(m.Reply) > maxName {
		return &natswire.Error{Msg: "a JetStream delivery's subject or ack subject is longer than the replay log's 255 bytes; the sidecar cannot record it"}
	}
	reply := string(m.Reply)
	msg := keyOf(ack.Stream, ack.Consumer, ack.StreamSeq)
	var repeats uint64
	if ack.Delivered > 1 {
		repeats = c.p.firsts.first(msg)
	}
	n := c.names(ack.Stream, ack.Consumer, m.Subject)
	c.noteSeen(n, ack.StreamSeq, m.SID)
	id, tk := c.p.tee.Append(shadowqueue.Record{
		Queue: n.stream, ConsumerTag: n.consumer,
		RoutingKey: n.subject, Exchange: reply,
		Redelivered: ack.Delivered > 1, Repeats: repeats,
		Properties: c.keep(m.Header), Body: c.keep(m.Body), Time: c.downClock(),
	})
	if repeats == 0 {
		c.p.firsts.note(msg, id)
	} else {
		c.p.repeats.Add(1)
	}
	key, now := n.key, c.downClock()
	c.p.tracker.Delivered(key, id, now, true)
	c.p.unacked.add(reply, delivery{tk: tk, id: id, key: key, at: now, msg: msg, from: c.origin})
	c.p.jsDeliveries.Add(1)
	return nil
}

// downClock returns the time of the read being parsed from the server,
// read from the clock once per read: the deliveries of one read arrived
// together, and a clock read per delivery was a tenth of the sidecar's own
// CPU on this path (a clock without vDSO costs a syscall). The caller
// holds c.mu.
func (c *conn) downClock() time.Time {
	if c.downAt.IsZero() {
		c.downAt = time.Now()
	}
	return c.downAt
}

// upClock is downClock for the read being parsed from the app; only the
// upstream pump calls it.
func (c *conn) upClock() time.Time {
	if c.upAt.IsZero() {
		c.upAt = time.Now()
	}
	return c.upAt
}

// deliveryNames are the strings a delivery's record and tracking take,
// kept from the last delivery: a consumer's deliveries on one connection
// share them (a pull consumer's all come to one inbox), so a delivery
// allocates none of them.
type deliveryNames struct {
	stream, consumer, subject string
	key                       string // ReplayKey(stream, consumer)
}

// names returns the strings for a delivery of stream's consumer on
// subject. The caller holds c.mu.
func (c *conn) names(stream, consumer, subject []byte) *deliveryNames {
	n := &c.lastNames
	if string(stream) != n.stream || string(consumer) != n.consumer {
		n.stream, n.consumer = string(stream), string(consumer)
		n.key = ReplayKey(n.stream, n.consumer)
	}
	if string(subject) != n.subject {
		n.subject = string(subject)
	}
	return n
}

// isReplayedRedelivery reports whether m, a JetStream delivery to a
// target, is a redelivery (delivery count above 1) of a message the replay
// gave the app: one the source's app was handed and never acked, which
// the source logged, and the server hands out again once the ack wait has
// passed, after the target switched.
func (c *conn) isReplayedRedelivery(ack natswire.JSAck) bool {
	if c.p.rp == nil {
		return false
	}
	return ack.Delivered > 1 && c.p.replayedMsgs.first(keyOf(ack.Stream, ack.Consumer, ack.StreamSeq)) != 0
}

// absorbRedelivery acks m at the server instead of giving it to the app.
// The caller holds c.mu; a failed write ends the connection.
func (c *conn) absorbRedelivery(m *natswire.Msg) error {
	c.p.redeliveriesAbsorbed.Add(1)
	c.upMu.Lock()
	defer c.upMu.Unlock()
	if _, err := c.up.Write(natswire.AppendPub(nil, m.Reply, nil, nil, natswire.AckAck)); err != nil {
		return fmt.Errorf("ack a redelivery of a replayed message: %w", err)
	}
	return nil
}

// releasePullSlot tells the app, when m, a delivery absorbed by
// absorbRedelivery, came for one of its pull requests, that the request
// will not deliver it: a 408 status with one pending message, as the
// server sends at a request's expiry with what it did not deliver. nats.go
// takes the message off the pull's pending count, as if delivered, and
// pulls again once the count is low; without it, a Consume waited for the
// request's expiry (30 s) for a batch the absorbed message never filled.
// The caller holds c.mu; the status is appended to out.
func (c *conn) releasePullSlot(m *natswire.Msg, out []byte) []byte {
	c.subMu.Lock()
	s, ok := c.subs[string(m.SID)]
	c.subMu.Unlock()
	if !ok || !s.pull {
		return out // a push consumer's: nothing counts its deliveries
	}
	size := len(m.Subject) + len(m.Reply) + len(m.Header) + len(m.Body)
	hdr := "NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1\r\nNats-Pending-Bytes: " + strconv.Itoa(size) + "\r\n\r\n"
	c.p.pullSlotsReleased.Add(1)
	return natswire.AppendMsg(out, m.Subject, m.SID, nil, []byte(hdr), nil)
}

// maxName is the longest string a replay log record field holds.
const maxName = 255

// blockSize is the size of the blocks keep copies into.
const blockSize = 32 << 10

// keep copies b, a delivery's header or body for its record, into the
// connection's current block, and starts a new block when b does not fit:
// one allocation for the many deliveries of a read instead of one each,
// which the garbage collector had to track one by one. A block is
// garbage once the records that share it are written to the log (the Tee
// drops them then) and the connection has moved on to another. The caller
// holds c.mu.
func (c *conn) keep(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	if cap(c.block)-len(c.block) < len(b) {
		if len(b) > blockSize/4 {
			return bytes.Clone(b) // a big one alone: it would waste the block's rest
		}
		c.block = make([]byte, 0, blockSize)
	}
	n := len(c.block)
	c.block = append(c.block, b...)
	return c.block[n:len(c.block):len(c.block)]
}

// isStatus reports whether m is a status message: an HMSG whose header
// block starts with a status code ("NATS/1.0 100 Idle Heartbeat", "NATS/1.0
// 100 FlowControl Request", "NATS/1.0 404 No Messages", ...).
func isStatus(m *natswire.Msg) bool {
	h := m.Header
	const v = "NATS/1.0"
	if len(h) < len(v)+4 || string(h[:len(v)]) != v || h[len(v)] != ' ' {
		return false
	}
	d := h[len(v)+1:]
	return d[0] >= '0' && d[0] <= '9' && d[1] >= '0' && d[1] <= '9' && d[2] >= '0' && d[2] <= '9'
}

// upstream reads from the app and queues its bytes for the writer.
func (c *conn) upstream(ctx context.Context) error {
	werr := make(chan error, 1)
	go func() { werr <- c.writer(ctx) }()
	err := c.readApp(ctx)
	close(c.queue)
	if errors.Is(err, io.EOF) {
		// The app closed its side: let the acks waiting on the log through,
		// within the drain timeout.
		select {
		case err = <-werr:
			if err == nil {
				err = io.EOF
			}
		case <-time.After(c.p.opts.DrainTimeout):
			c.log.Warn("the app closed its connection while acks still waited on the replay log; dropping them (the server redelivers)")
		case <-ctx.Done():
		}
		return err
	}
	return err
}

func (c *conn) readApp(ctx context.Context) error {
	parser := natswire.NewParser(0)
	buf := make([]byte, readBufSize)
	for {
		select {
		case mp := <-c.payloadCh:
			parser.SetMaxPayload(mp)
		default:
		}
		n, rerr := c.app.Read(buf)
		if n > 0 {
			r, err := c.parseApp(ctx, parser, buf[:n])
			if err != nil {
				c.refuseApp(err)
				return err
			}
			if err := c.sendRead(ctx, &r); err != nil {
				return err
			}
		}
		if rerr != nil {
			return rerr
		}
	}
}

// parseApp parses one read from the app (data). The chunk it returns
// gets the complete messages of data that go to the server, copied: the
// writer owns it. A message split across reads goes in the chunk of the
// read that completes it, so that an absorbed ack is never half sent.
func (c *conn) parseApp(ctx context.Context, parser *natswire.Parser, data []byte) (appRead, error) {
	var r appRead
	c.upAt = time.Time{}
	r.ch.data = make([]byte, 0, len(data)+parser.Buffered())
	err := parser.Parse(data, func(m *natswire.Msg) error {
		if c.onAppMsg(ctx, m, &r) {
			r.ch.data = append(r.ch.data, m.Raw...)
		}
		return nil
	})
	return r, err
}

// appRead is what one read from the app gathers: the chunk for the
// server, the PINGs in it, and the PONGs that skip the queue.
type appRead struct {
	ch    chunk
	pings int
	pongs []byte
}

// onAppMsg handles one message from the app and reports whether it goes
// on to the server in r's chunk.
func (c *conn) onAppMsg(ctx context.Context, m *natswire.Msg, r *appRead) bool {
	switch m.Op {
	case natswire.OpSub:
		c.trackSub(m)
		if c.p.rp != nil && c.holdSub(ctx, m) {
			return false // fed from the log; it goes upstream at the switch
		}
	case natswire.OpUnsub:
		if c.untrackSub(m) {
			return false // the server never had it
		}
	case natswire.OpPub, natswire.OpHPub:
		return c.onAppPub(ctx, m, &r.ch)
	case natswire.OpPong:
		r.pongs = append(r.pongs, m.Raw...)
		return false
	case natswire.OpPing:
		r.pings++
	}
	return true
}

// onAppPub handles a PUB or HPUB from the app: a replayed delivery's ack
// is settled here, an ack of a live one gates ch on its log record, a pull
// request is answered from the log or held while the proxy is not serving,
// and a publish during replay is absorbed. It reports whether m goes on.
func (c *conn) onAppPub(ctx context.Context, m *natswire.Msg, ch *chunk) bool {
	if c.p.rp != nil && bytes.HasPrefix(m.Subject, []byte(replayAckPrefix)) {
		if c.p.onReplayAck(m.Subject, m.Body, c.upClock()) {
			c.replaySettled.Add(1)
		}
		if len(m.Reply) > 0 { // AckSync: the server would confirm it
			if sid := c.sidFor(string(m.Reply)); sid != nil {
				_ = c.writeApp(natswire.AppendMsg(nil, m.Reply, sid, nil, nil, nil)) // a failed write ends the connection anyway
			}
		}
		return false // a replayed delivery's: the server never sent it
	}
	if bytes.HasPrefix(m.Subject, []byte(natswire.AckPrefix)) && natswire.IsAckBody(m.Body) {
		settle := !bytes.HasPrefix(m.Body, natswire.AckProgress)
		d, ok := c.p.unacked.lookup(m.Subject, settle)
		if !ok {
			c.p.acksAbsorbed.Add(1)
			return false
		}
		c.p.acks.Add(1)
		if settle {
			c.p.settled(d.key, d.id, d.at, c.upClock(), m.Body)
		}
		if !c.p.tee.Durable(d.tk) {
			c.p.acksWaited.Add(1)
			ch.gate, ch.gated = max(ch.gate, d.tk), true
		}
	}
	if bytes.HasPrefix(m.Subject, []byte(pullPrefix)) {
		c.notePulled(m.Subject[len(pullPrefix):])
	}
	if bytes.HasPrefix(m.Subject, []byte(pullPrefix)) && !c.onAppPull(ctx, m, ch) {
		return false
	}
	if c.p.absorbing() && isAppPublish(m.Subject) {
		c.absorbPublish(ctx, m)
		return false
	}
	return true
}

// onAppPull handles the app's pull request m: answered from the log while
// its consumer replays, held while the proxy is quiesced or stopped. It
// reports whether m goes on to the server; ch gets what goes instead.
func (c *conn) onAppPull(ctx context.Context, m *natswire.Msg, ch *chunk) bool {
	if sid := c.sidFor(string(m.Reply)); sid != nil {
		c.markPull(sid)
	}
	h, ok := c.parsePull(m)
	if ok && c.p.rp != nil {
		k := c.p.rp.key(h.stream, h.consumer)
		if !k.isSwitched() {
			if c.holdInbox(h.sid, k) {
				// After the app's SUB, in the same queue.
				ch.data = natswire.AppendUnsub(ch.data, h.sid, 0)
			}
			go c.servePull(ctx, h)
			return false // answered from the log
		}
		// Switched: its inbox goes back on the server before this
		// request, if the switch has not put it back yet.
		ch.data = append(ch.data, c.takeHeldInboxes(k)...)
	}
	switch {
	case c.p.Mode() != proxy.Serving:
		c.p.pullsAbsorbed.Add(1)
		if ok {
			go c.holdPull(ctx, h)
		}
		return false // no new deliveries while quiesced or stopped
	}
	return true
}

// sendRead writes r's PONGs to the server at once, and queues its chunk.
func (c *conn) sendRead(ctx context.Context, r *appRead) error {
	if len(r.pongs) > 0 {
		// Answers to the server's PINGs skip the queue: a slow log
		// must not make the server drop the app as stale.
		c.upMu.Lock()
		_, err := c.up.Write(r.pongs)
		c.upMu.Unlock()
		if err != nil {
			return err
		}
	}
	r.ch.pings = r.pings
	if len(r.ch.data) == 0 {
		return nil
	}
	c.queued.Add(1)
	select {
	case c.queue <- r.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writer writes the app's chunks to the server, in order, each once the log
// record it is gated on is durable. The chunks already queued behind the
// one it waited for go in the same write (writev) as long as their records
// are durable too: an ack that waited on the log is usually one of many
// that became durable with the same log write, and one write to the server
// for them all saves a syscall per read of the app.
func (c *conn) writer(ctx context.Context) error {
	var (
		bufs   net.Buffers
		next   chunk
		have   bool
		closed bool
	)
	for {
		if !have {
			if closed {
				return nil
			}
			if next, have = <-c.queue; !have {
				return nil
			}
		}
		ch := next
		have = false
		if ch.gated {
			if err := c.p.tee.Wait(ctx, ch.gate); err != nil {
				return err
			}
		}
		bufs = append(bufs[:0], ch.data)
		n, pings, size := 1, ch.pings, len(ch.data)
	batch:
		for size < maxWriteBatch {
			select {
			case next, have = <-c.queue:
				if !have {
					closed = true
					break batch
				}
				if next.gated && !c.p.tee.Durable(next.gate) {
					break batch // it waits: write what is ready first
				}
				bufs = append(bufs, next.data)
				n, pings, size = n+1, pings+next.pings, size+len(next.data)
				have = false
			default:
				break batch
			}
		}
		w := bufs // WriteTo consumes w; bufs keeps its array for the next batch
		c.upMu.Lock()
		_, err := w.WriteTo(c.up)
		c.pingsSent += uint64(pings)
		c.upMu.Unlock()
		c.queued.Add(-int64(n))
		clear(bufs) // the chunks' bytes are the GC's again
		if err != nil {
			return err
		}
	}
}

// maxWriteBatch bounds the bytes of the chunks the writer gathers into one
// write to the server.
const maxWriteBatch = 256 << 10

// pullPrefix starts the subject of a pull consumer's request for messages.
const pullPrefix = "$JS.API.CONSUMER.MSG.NEXT."

// jsDelivery reports whether m is a JetStream delivery (not a status
// message) that the tee records and the app acks, and reads its ack
// subject.
func jsDelivery(m *natswire.Msg) (natswire.JSAck, bool) {
	if isStatus(m) {
		return natswire.JSAck{}, false
	}
	return natswire.ParseJSAck(m.Reply)
}

// setMode switches the connection to mode. Deliveries held back are handed
// to the app (teed first) when it leaves Quiesced; it returns how many.
func (c *conn) setMode(mode proxy.Mode) (released int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mode = mode
	if mode == proxy.Quiesced || len(c.held) == 0 {
		return 0, nil
	}
	var out []byte
	parser := natswire.NewParser(natswire.HardMaxPayload)
	for _, raw := range c.held {
		err := parser.Parse(raw, func(m *natswire.Msg) error {
			if err := c.onMsg(m); err != nil {
				return err
			}
			out = append(out, m.Raw...)
			released++
			return nil
		})
		if err != nil {
			return released, err
		}
	}
	c.held = nil
	if _, err := c.app.Write(out); err != nil {
		return released, err
	}
	return released, nil
}

// heldCount returns the deliveries held back and dropped so far.
func (c *conn) heldCount() (held, dropped int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.held), c.dropped
}
