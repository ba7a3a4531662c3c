package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ms2m/ms2m/internal/amqpwire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/upstream"
)

// segment is a run of raw app frames bound for the broker. If gated, the
// writer waits until ticket gate is durable in the log before writing it.
type segment struct {
	raw   []byte
	gated bool
	gate  shadowqueue.Ticket
	// tail is set when raw ends with a cumulative ack, which a following
	// ack on the same channel may absorb (coalesce.go).
	tail cumAck
}

// onlyAck reports whether the segment is one cumulative ack and nothing else.
func (s *segment) onlyAck() bool { return s.tail.last(s.raw) && s.tail.start == 0 }

// conn is one app connection and its broker connection.
type conn struct {
	p       *Proxy
	id      uint64
	app, up net.Conn
	log     *slog.Logger
	// handshake rewrites the app's start-ok and open where the sidecar
	// owns the credentials; used by the upstream pump alone.
	handshake *upstream.Handshake

	// Lock order: mu, then appMu or upMu.
	mu    sync.Mutex // guards the fields below it up to the next blank line
	mode  Mode
	chans map[uint16]*channel
	// requeued is set once Stop released the held deliveries; later ones
	// go straight back to the broker.
	requeued bool
	// late collects frames for the broker made while mu is held; the pump
	// queues them after it lets go of mu.
	late []byte
	// unreplayable holds the queues this connection consumed that a
	// migration cannot carry over (queues.go).
	unreplayable map[string]bool
	// polled holds the queues the app asked for with basic.get (at most
	// shadowqueue.MaxCutoffQueues): a stop's cutoff marker names them.
	polled map[string]bool
	// Losing the broker (drainApp). closing is set once a connection.close
	// passed either way: the connection is ending, not lost. lastDown is
	// when the sidecar last read from the broker; recent are the app's last
	// acks. draining is set once the broker's connection is gone, while the
	// app may still settle what it holds; drainEnded once it may not.
	// upClose is the broker's own connection.close, which the app gets
	// only once the drain ends; appClose is set if the app asked to close
	// during it.
	closing    bool
	lastDown   time.Time
	recent     recentAcks
	draining   bool
	drainEnded bool
	upClose    []byte
	appClose   bool

	appMu sync.Mutex // serialises writes to app
	upMu  sync.Mutex // serialises writes to up

	qMu     sync.Mutex // guards upQ sends against close
	qClosed bool
	upQ     chan segment
	queued  atomic.Int64 // segments queued and not yet written
	gated   atomic.Int64 // gated segments queued and not yet written

	// heartbeat is the interval the app and the broker agreed on (0: none);
	// lastUp is when the sidecar last wrote to the broker, in Unix ns.
	heartbeat atomic.Int64
	lastUp    atomic.Int64

	downP, upP *amqpwire.Parser
	closeOnce  sync.Once

	// ctx ends with the connection; replay feeders run under it.
	ctx    context.Context
	cancel context.CancelFunc
	kickCh chan struct{} // closed (and replaced) to wake replay feeders; guarded by mu
	// drained is closed when the drain ends; appDone and appGone once
	// pumpUp returned.
	drained chan struct{}
	appDone atomic.Bool
	appGone chan struct{}
}

func newConn(p *Proxy, id uint64, app, up net.Conn, log *slog.Logger) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	return &conn{
		ctx: ctx, cancel: cancel, kickCh: make(chan struct{}), drained: make(chan struct{}), appGone: make(chan struct{}),
		p: p, id: id, app: app, up: up, log: log,
		chans: map[uint16]*channel{},
		upQ:   make(chan segment, 256),
		downP: amqpwire.NewParser(p.opts.InitialFrameMax),
		upP:   amqpwire.NewParser(p.opts.InitialFrameMax),
	}
}

func (c *conn) abort() {
	c.closeOnce.Do(func() {
		c.cancel()
		c.app.Close()
		c.up.Close()
	})
}

// run pumps frames both ways until either side closes.
func (c *conn) run(ctx context.Context) {
	stop := context.AfterFunc(ctx, c.abort)
	defer stop()

	writerCtx, cancelWriter := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWriter()
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		c.writeUp(writerCtx)
	}()
	go c.keepUpstreamAlive()
	downDone := make(chan struct{})
	go func() {
		defer close(downDone)
		// pumpDown and pumpUp end only on an error: EOF or a closed
		// connection is the ordinary end.
		if err := c.pumpDown(); !isClosed(err) && !errors.Is(err, errBrokerClosed) {
			c.log.Debug("broker side ended", "err", err)
		}
		c.drainApp()
		c.closeApp() // ends pumpUp's read
	}()

	if err := c.pumpUp(); !isClosed(err) {
		c.log.Debug("app side ended", "err", err)
	}
	c.appDone.Store(true)
	close(c.appGone)
	c.mu.Lock()
	c.endDrainLocked()
	c.mu.Unlock()
	// The app is gone or done. Its last acks may still wait on the log: let
	// the writer forward them, within DrainTimeout.
	c.qMu.Lock()
	c.qClosed = true
	close(c.upQ)
	c.qMu.Unlock()
	drain := time.AfterFunc(c.p.opts.DrainTimeout, cancelWriter)
	<-writerDone
	drain.Stop()
	// *net.TCPConn half-closes; *tls.Conn (TLS to the broker) sends
	// close_notify, after which the broker ends its side too.
	if cw, ok := c.up.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite() // fails only if the broker's side is gone already
	}
	select {
	case <-downDone:
	case <-time.After(time.Second):
	}
	c.abort()
	<-downDone
	c.dropAll()
}

// failApp ends the connection after a write to the app failed: the app went
// away, or stopped reading for the whole write deadline, and a frame written
// in part leaves the stream unusable for what follows.
func (c *conn) failApp(err error) {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.log.Warn("closing the connection: the app read nothing for the whole write deadline", "err", err)
	case !isClosed(err):
		c.log.Debug("closing the connection: cannot write to the app", "err", err)
	}
	c.abort()
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

// push queues a segment for the broker, in order.
func (c *conn) push(s segment) {
	if len(s.raw) == 0 {
		return
	}
	c.qMu.Lock()
	defer c.qMu.Unlock()
	if c.qClosed {
		return
	}
	c.queued.Add(1)
	if s.gated {
		c.gated.Add(1)
	}
	c.upQ <- s
}

// writeUp writes queued segments to the broker, waiting on the log for
// gated ones. Segments that are ready are written together, in one call.
func (c *conn) writeUp(ctx context.Context) {
	broken := false
	var buf []byte
	var tail cumAck // a cumulative ack that ends buf
	done := 0       // segments in buf
	flush := func() {
		if len(buf) > 0 && !broken {
			c.upMu.Lock()
			_, err := c.up.Write(buf)
			c.upMu.Unlock()
			if err != nil {
				// The broker's connection is gone: closing it ends pumpDown,
				// which lets the app settle what it holds (drainApp).
				broken = true
				c.up.Close()
			}
			c.lastUp.Store(time.Now().UnixNano())
		}
		buf, tail = buf[:0], cumAck{}
		c.queued.Add(int64(-done))
		done = 0
	}
	for s := range c.upQ {
		for {
			if s.gated && !broken && !c.p.tee.Durable(s.gate) {
				flush()
				start := time.Now()
				if err := c.p.tee.Wait(ctx, s.gate); err != nil {
					c.log.Error("app acks not forwarded: their deliveries are not durable in the replay log; the broker will redeliver them",
						"err", err)
					broken = true
				}
				c.p.opts.Metrics.gateWaits.Observe(time.Since(start).Seconds())
			}
			buf = c.appendSegment(buf, &tail, &s)
			done++
			if s.gated {
				c.gated.Add(-1)
			}
			if len(buf) >= 256<<10 {
				break
			}
			var ok bool
			select {
			case s, ok = <-c.upQ:
				if ok {
					continue
				}
			default:
			}
			break
		}
		flush()
	}
}

// appendSegment appends s to buf, the bytes about to go upstream. A segment
// that is one cumulative ack absorbs one that ends buf on the same channel.
func (c *conn) appendSegment(buf []byte, tail *cumAck, s *segment) []byte {
	if s.onlyAck() {
		buf, merged := appendAck(buf, tail, s.tail.ch, s.tail.tag, s.raw, true)
		if merged {
			c.p.opts.Metrics.acksCoalesced.Inc()
		}
		return buf
	}
	start := len(buf)
	buf = append(buf, s.raw...)
	*tail = cumAck{}
	if s.tail.last(s.raw) {
		*tail = s.tail
		tail.start += start
		tail.end += start
	}
	return buf
}

// keepUpstreamAlive sends the broker a heartbeat whenever nothing went to
// it for half the agreed interval. The app's own heartbeats do not cover
// that: a client sends them only while it writes nothing else, and while a
// target replays, the sidecar swallows the app's acks of replayed messages
// (and its publishes), so the broker would hear nothing from a busy app and
// close the connection after two missed heartbeats.
func (c *conn) keepUpstreamAlive() {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	hb := amqpwire.AppendHeartbeat(nil)
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-tick.C:
		}
		interval := time.Duration(c.heartbeat.Load())
		if interval <= 0 || time.Since(time.Unix(0, c.lastUp.Load())) < interval/2 {
			continue
		}
		c.upMu.Lock()
		_, err := c.up.Write(hb)
		c.upMu.Unlock()
		if err != nil {
			return
		}
		c.lastUp.Store(time.Now().UnixNano())
	}
}

// pumpUp reads the app's frames, settles acks and queues the frames for the
// broker.
func (c *conn) pumpUp() error {
	hdr := make([]byte, len(amqpwire.ProtocolHeader))
	if _, err := io.ReadFull(c.app, hdr); err != nil {
		return err
	}
	c.push(segment{raw: hdr})
	if !bytes.Equal(hdr, amqpwire.ProtocolHeader) {
		// Not AMQP 0-9-1: the broker answers with the version it speaks and
		// closes. Pass the rest through untouched.
		return c.copyRawUp()
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := c.app.Read(buf)
		if n > 0 {
			seg := segment{raw: make([]byte, 0, n)}
			c.mu.Lock()
			perr := c.upP.Parse(buf[:n], func(f amqpwire.Frame) error { return c.onUp(f, &seg) })
			late := c.takeLateLocked()
			c.mu.Unlock()
			c.push(seg)
			c.push(segment{raw: late})
			if perr != nil {
				c.protocolError("app", perr)
				return perr
			}
		}
		if err != nil {
			return err
		}
	}
}

func (c *conn) copyRawUp() error {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.app.Read(buf)
		if n > 0 {
			c.push(segment{raw: bytes.Clone(buf[:n])})
		}
		if err != nil {
			return err
		}
	}
}

func (c *conn) takeLateLocked() []byte {
	l := c.late
	c.late = nil
	return l
}

func (c *conn) channel(id uint16) *channel {
	ch := c.chans[id]
	if ch == nil {
		ch = newChannel(id)
		c.chans[id] = ch
	}
	return ch
}

// onUp handles one frame from the app. It runs with c.mu held.
func (c *conn) onUp(f amqpwire.Frame, seg *segment) error {
	if c.draining {
		return c.onDrainFrame(f)
	}
	switch f.Type {
	case amqpwire.FrameHeartbeat:
		if c.gated.Load() > 0 {
			// Acks wait on the log: do not let heartbeats wait behind them.
			c.upMu.Lock()
			_, err := c.up.Write(f.Raw)
			c.upMu.Unlock()
			return err
		}
	case amqpwire.FrameMethod:
		raw, err := c.onUpMethod(f, seg)
		if err != nil {
			return err
		}
		seg.raw = append(seg.raw, raw...)
		return nil
	case amqpwire.FrameHeader:
		ch := c.channel(f.Channel)
		if ch.up == nil || ch.up.header {
			return unexpected(f, "content header from the app without basic.publish")
		}
		size, err := amqpwire.ContentHeaderBodySize(f.Payload)
		if err != nil {
			return err
		}
		ch.up.header, ch.up.size = true, size
		absorb := ch.up.absorb
		if size == 0 {
			c.publishDone(ch)
		}
		if absorb {
			return nil
		}
	case amqpwire.FrameBody:
		ch := c.channel(f.Channel)
		if ch.up == nil || !ch.up.header {
			return unexpected(f, "body frame from the app without a content header")
		}
		ch.up.got += uint64(len(f.Payload))
		if ch.up.pub != nil {
			ch.up.pub.sum.Write(f.Payload)
		}
		if ch.up.got > ch.up.size {
			return &amqpwire.Error{Code: amqpwire.FrameError, Text: fmt.Sprintf("body on channel %d is longer than its content header says (%d bytes)", f.Channel, ch.up.size)}
		}
		absorb := ch.up.absorb
		if ch.up.got == ch.up.size {
			c.publishDone(ch)
		}
		if absorb {
			return nil
		}
	default:
		return &amqpwire.Error{Code: amqpwire.FrameError, Text: fmt.Sprintf("unknown frame type %d on channel %d", f.Type, f.Channel)}
	}
	seg.raw = append(seg.raw, f.Raw...)
	return nil
}

// publishDone ends an app publish's content. An absorbed publish on a
// confirm channel is confirmed to the app by the sidecar.
func (c *conn) publishDone(ch *channel) {
	if ch.up.absorb && ch.up.tag != 0 {
		c.writeApp(amqpwire.AppendMethodFrame(nil, ch.id, &amqpwire.BasicAck{DeliveryTag: ch.up.tag}))
		ch.absorbed++
	}
	if pc := ch.up.pub; pc != nil {
		pub := pc.publish()
		if ch.up.absorb {
			c.p.observe(pc.forID, pub)
		} else {
			c.p.tee.AppendPublish(pc.forID, pub.Exchange, pub.RoutingKey, pub.Digest[:])
		}
	}
	ch.up = nil
}

func unexpected(f amqpwire.Frame, what string) error {
	return &amqpwire.Error{Code: amqpwire.UnexpectedFrame, Text: fmt.Sprintf("%s (channel %d)", what, f.Channel)}
}

// appQueues adds to qs the queues the app takes from on this connection:
// those of its consumers (also the ones a stop cancelled and the ones a
// replay serves) and those it polled with basic.get.
func (c *conn) appQueues(qs map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.chans {
		for _, cons := range ch.consumers {
			qs[cons.queue] = true
		}
		for _, cons := range ch.cancelled {
			qs[cons.queue] = true
		}
		for _, rc := range ch.replaying {
			qs[rc.m.Queue] = true
		}
	}
	for q := range c.polled {
		qs[q] = true
	}
}

// notePolled remembers that the app polled queue. Call with mu held.
func (c *conn) notePolled(queue string) {
	if c.polled == nil {
		c.polled = map[string]bool{}
	}
	if len(c.polled) < shadowqueue.MaxCutoffQueues {
		c.polled[queue] = true
	}
}
