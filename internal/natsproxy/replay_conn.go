package natsproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ms2m/ms2m/internal/natswire"
	"github.com/ms2m/ms2m/internal/proxy"
)

// appSub is one of the app's subscriptions.
type appSub struct {
	subject, queue string
	raw            []byte // the app's SUB, to send again on a resume after a stop
	pull           bool   // the reply subject of the app's pull requests
	unsubscribed   bool   // a stop took it off the server
	// heldFor is, on a target, the consumer whose pull requests the app
	// makes on this subscription while the sidecar answers them from the
	// log: the subscription is off the server until that consumer
	// switches (holdInbox).
	heldFor *keyReplay
}

// maxSubs bounds the subscriptions a connection's table keeps.
const maxSubs = 1 << 16

// trackSub records the app's SUB m; untrackSub its UNSUB (an UNSUB with a
// maximum leaves the subscription in the table until the app's next UNSUB
// of it: the proxy does not count its messages).
func (c *conn) trackSub(m *natswire.Msg) {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	if len(c.subs) < maxSubs {
		c.subs[string(m.SID)] = appSub{subject: string(m.Subject), queue: string(m.Queue), raw: bytes.Clone(m.Raw)}
	}
}

func (c *conn) untrackSub(m *natswire.Msg) (held bool) {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	sid := string(m.SID)
	if f := c.feeds[sid]; f != nil {
		f.cancel()
		delete(c.feeds, sid)
		held = true
	}
	if m.Max == 0 {
		delete(c.subs, sid)
	}
	return held
}

// markPull notes that the app's subscription sid is the reply subject of
// its pull requests.
func (c *conn) markPull(sid []byte) {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	if s, ok := c.subs[string(sid)]; ok && !s.pull {
		s.pull = true
		c.subs[string(sid)] = s
	}
}

// sidFor returns the sid of the app's subscription that a message on
// subject reaches, or nil.
func (c *conn) sidFor(subject string) []byte {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	for sid, s := range c.subs {
		if subjectMatches(s.subject, subject) {
			return []byte(sid)
		}
	}
	return nil
}

// subjectMatches reports whether subject matches the subscription pattern
// (tokens split by '.', '*' one token, '>' the rest).
func subjectMatches(pattern, subject string) bool {
	for {
		pi := strings.IndexByte(pattern, '.')
		si := strings.IndexByte(subject, '.')
		pt, st := pattern, subject
		if pi >= 0 {
			pt = pattern[:pi]
		}
		if si >= 0 {
			st = subject[:si]
		}
		switch {
		case pt == ">":
			return subject != ""
		case pt != "*" && pt != st:
			return false
		}
		if pi < 0 || si < 0 {
			return pi < 0 && si < 0
		}
		pattern, subject = pattern[pi+1:], subject[si+1:]
	}
}

// pushFeed is a held app subscription on a push consumer's deliver
// subject, fed from the log.
type pushFeed struct {
	k      *keyReplay
	sid    []byte
	raw    []byte // the app's SUB, sent to the server at the switch
	cancel context.CancelFunc
}

// holdSub decides, on a target, what becomes of the app's SUB m: if its
// subject is the deliver subject of a push consumer still being replayed,
// the sidecar keeps it from the server and feeds it from the log (true).
func (c *conn) holdSub(ctx context.Context, m *natswire.Msg) bool {
	if bytes.ContainsAny(m.Subject, "*>") {
		return false
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	stream, consumer, ok, err := c.p.rp.lookup.PushConsumer(lctx, string(m.Subject))
	cancel()
	if err != nil {
		// Passing it on could double deliveries (the source's app is
		// subscribed too); holding it could starve a core subscription.
		// Fail the replay so that the migrator rolls back.
		err = errors.New("look up whether the app's subscription to " + string(m.Subject) + " is a JetStream push consumer's: " + err.Error())
		c.log.Error("replay failed", "err", err)
		c.p.rp.failed(err)
		return false
	}
	if !ok {
		return false
	}
	k := c.p.rp.key(stream, consumer)
	if k.isSwitched() {
		return false
	}
	fctx, fcancel := context.WithCancel(ctx)
	f := &pushFeed{k: k, sid: bytes.Clone(m.SID), raw: bytes.Clone(m.Raw), cancel: fcancel}
	c.subMu.Lock()
	if old := c.feeds[string(m.SID)]; old != nil {
		old.cancel()
	}
	c.feeds[string(m.SID)] = f
	c.subMu.Unlock()
	// A JetStream subscription from now on, whether or not the server
	// delivers on it after the switch: a stop must take it off the server
	// (a statefulset-shadow's shadow is stopped in turn).
	c.mu.Lock()
	if len(c.jsSIDs) < maxSubs {
		c.jsSIDs[string(m.SID)] = true
	}
	c.mu.Unlock()
	c.startReplaying(k)
	c.log.Info("replaying to the app's push subscription", "stream", stream, "consumer", consumer, "subject", string(m.Subject))
	go c.feedPush(fctx, f)
	return true
}

// startReplaying and stopReplaying count k as served from the log for
// this connection (replayer.active), once. A key already switched is not
// counted: switchKey's stopReplaying has been or is about to be called for
// every connection (it sets switched first, then takes each subMu), and a
// pull request served after it would otherwise keep the target in replay
// mode, absorbing the app's publishes, for good.
func (c *conn) startReplaying(k *keyReplay) {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	if !c.replaying[k] && !k.isSwitched() {
		c.replaying[k] = true
		c.p.rp.active.Add(1)
	}
}

func (c *conn) stopReplaying(k *keyReplay) {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	if c.replaying[k] {
		delete(c.replaying, k)
		c.p.rp.active.Add(-1)
	}
}

// feedPush hands k's records to the app's held subscription f in order,
// at most maxReplayInFlight unacked, and, once the app has acked every
// record up to the cutoff, sends its SUB to the server.
func (c *conn) feedPush(ctx context.Context, f *pushFeed) {
	k := f.k
	for ctx.Err() == nil {
		if k.isSwitched() {
			c.releaseFeed(f)
			return
		}
		wake := k.wake()
		if k.inFlightCount() >= maxReplayInFlight {
			if !waitOn(ctx, wake) {
				return
			}
			continue
		}
		if !k.lockFeed(ctx) {
			return
		}
		_, done, err := c.replayRun(ctx, k, f.sid, maxReplayInFlight-k.inFlightCount(), false)
		k.unlockFeed()
		switch {
		case err != nil:
			return
		case done == doneAll:
			c.p.switchKey(k)
			c.releaseFeed(f)
			return
		case done == doneUnacked:
			if !waitOn(ctx, wake) {
				return
			}
		}
	}
}

// releaseFeed sends the held subscription f to the server: from now on
// it is an ordinary one (an UNSUB of the app's goes to the server too).
func (c *conn) releaseFeed(f *pushFeed) {
	c.subMu.Lock() // held over the write: an UNSUB of the app's goes after it
	defer c.subMu.Unlock()
	if c.feeds[string(f.sid)] != f {
		return // the app unsubscribed meanwhile
	}
	delete(c.feeds, string(f.sid))
	c.sendUp(f.raw)
}

// Outcomes of replayOne.
const (
	sentOne     = iota // a record went to the app
	doneUnacked        // none left, but the app has not settled them all
	doneAll            // none left, all settled: the key may switch
)

// replayOne adds the next record of k to b, for the subscription sid: the
// app's subscription on a push consumer's deliver subject, or the one that
// gets its pull request's replies. Either way the message carries the
// record's own subject, as the server's deliveries do: only the sid routes
// it. (nats.js takes a message on its pull inbox's own subject for a status
// and drops it.) It writes what b holds before it waits for a record, once
// none is left, and when b is full. Callers hold k's feed.
func (c *conn) replayOne(ctx context.Context, k *keyReplay, sid []byte, b *replayBatch) (int, error) {
	idx, redelivered := k.claim()
	rec, done, err := c.nextRecord(ctx, k, idx, b)
	if err == nil && !done {
		err = replayRecordErr(&rec, k)
	}
	if err != nil {
		k.release(idx, !redelivered)
		if ctx.Err() == nil && !errors.Is(err, errAppWrite) {
			c.log.Error("replay failed; the app gets nothing more of this consumer and nothing is consumed upstream", "key", k.key, "err", err)
			c.p.rp.failed(err)
		}
		return 0, err
	}
	if done {
		k.release(idx, true)
		if err := c.flushReplay(b); err != nil {
			return 0, err
		}
		if k.allAcked(idx) {
			return doneAll, nil
		}
		return doneUnacked, nil
	}
	now := time.Now()
	b.add(natswire.AppendMsg(b.out, []byte(rec.RoutingKey), sid, replayReply(&rec, redelivered), rec.Properties, rec.Body), rec.ID)
	k.handedOut(rec.ID, idx, c, now)
	if a, ok := natswire.ParseJSAck([]byte(rec.Exchange)); ok {
		c.p.replayedMsgs.note(keyOf(a.Stream, a.Consumer, a.StreamSeq), rec.ID)
	}
	c.p.tracker.Delivered(k.key, rec.ID, now, true)
	if b.full() {
		if err := c.flushReplay(b); err != nil {
			return 0, err
		}
	}
	return sentOne, nil
}

func waitOn(ctx context.Context, ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// writeApp writes whole messages to the app, between the downstream
// pump's writes.
func (c *conn) writeApp(b []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.app.Write(b)
	return err
}

// holdInbox takes the app's subscription sid, the reply subject of its
// pull requests for k, off the server until k switches (takeHeldInboxes),
// and reports whether the caller is to send the UNSUB. A restored app's
// inbox is its source's, byte for byte (CRIU restores nats.go's memory):
// on the server, the source's open pull requests would go on delivering
// to it through the target's subscription after the stop's UNSUB, and a
// target drops a delivery it cannot number yet (before the cutoff is
// known), which the server gives again only after the ack wait, behind
// later messages. Off the server, such a delivery finds no interest, and
// the server keeps it for the next pull request, the target's after the
// switch. A subscription with a wildcard (a request mux) is left on.
func (c *conn) holdInbox(sid []byte, k *keyReplay) bool {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	s, ok := c.subs[string(sid)]
	if !ok || s.heldFor != nil || s.unsubscribed || c.feeds[string(sid)] != nil || strings.ContainsAny(s.subject, "*>") {
		return false
	}
	s.heldFor = k
	c.subs[string(sid)] = s
	return true
}

// takeHeldInboxes returns the SUBs of the pull inboxes held for k, which
// are no longer held. They go in the app's queue ahead of its first pull
// request after k's switch (onAppPull), never straight to the server: the
// UNSUB that held an inbox may still wait in that queue, and a SUB
// written before it would be undone by it.
func (c *conn) takeHeldInboxes(k *keyReplay) []byte {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	var out []byte
	for sid, s := range c.subs {
		if s.heldFor != k {
			continue
		}
		s.heldFor = nil
		c.subs[sid] = s
		if !s.unsubscribed {
			out = append(out, s.raw...)
		}
	}
	return out
}

// sendUp writes b to the server, outside the queue of the app's chunks.
func (c *conn) sendUp(b []byte) {
	c.upMu.Lock()
	defer c.upMu.Unlock()
	if _, err := c.up.Write(b); err != nil {
		c.log.Warn("cannot write to the NATS server", "err", err)
		c.abort()
	}
}

// pullRequest is the JSON body of $JS.API.CONSUMER.MSG.NEXT, the fields a
// sidecar that answers one itself needs.
type pullRequest struct {
	Batch     int   `json:"batch,omitempty"`
	Expires   int64 `json:"expires,omitempty"` // nanoseconds
	NoWait    bool  `json:"no_wait,omitempty"`
	Heartbeat int64 `json:"idle_heartbeat,omitempty"` // nanoseconds
}

// heldPull is a pull request of the app's that the sidecar answers.
type heldPull struct {
	stream, consumer string
	reply, sid       []byte
	req              pullRequest
	deadline         time.Time // zero: none

	// mu orders its idle heartbeats before its last status (ended): a
	// heartbeat after a request's 408 or 404, as a tick of pullContext's
	// ticker could make, is not what a server sends.
	mu    sync.Mutex
	ended bool
}

// heartbeat sends h's idle heartbeat, unless its last status went.
func (c *conn) heartbeat(h *heldPull) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ended {
		_ = c.writeApp(h.status("100", "Idle Heartbeat", -1))
	}
}

// lastStatus sends b, the last status of the pull request h (a 408 or a
// 404): no heartbeat of h goes after it.
func (c *conn) lastStatus(h *heldPull, b []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended = true
	_ = c.writeApp(b)
}

// parsePull reads the app's pull request m. ok is false when the sidecar
// cannot answer it (no subscription of the app's gets its reply, or the
// subject or body are not a pull request's): then it goes on as it is.
func (c *conn) parsePull(m *natswire.Msg) (*heldPull, bool) {
	rest := string(m.Subject[len(pullPrefix):])
	i := strings.IndexByte(rest, '.')
	if i <= 0 || i == len(rest)-1 || strings.ContainsAny(rest[i+1:], ".*>") || len(m.Reply) == 0 {
		return nil, false
	}
	h := &heldPull{stream: rest[:i], consumer: rest[i+1:], reply: bytes.Clone(m.Reply)}
	if len(bytes.TrimSpace(m.Body)) > 0 {
		if json.Unmarshal(m.Body, &h.req) != nil {
			return nil, false
		}
	}
	h.req.Batch = max(h.req.Batch, 1)
	if h.req.Expires > 0 {
		h.deadline = time.Now().Add(time.Duration(h.req.Expires))
	}
	h.sid = c.sidFor(string(m.Reply))
	if h.sid == nil {
		return nil, false
	}
	return h, true
}

// status returns a status message to the pull request's reply subject, as
// nats-server sends them.
func (h *heldPull) status(code, text string, pending int) []byte {
	hdr := "NATS/1.0 " + code + " " + text + "\r\n"
	if pending >= 0 {
		hdr += "Nats-Pending-Messages: " + strconv.Itoa(pending) + "\r\nNats-Pending-Bytes: 0\r\n"
	}
	return natswire.AppendMsg(nil, h.reply, h.sid, nil, []byte(hdr+"\r\n"), nil)
}

// endEarly ends a pull request the sidecar held, with left messages not
// sent, once the server is to take over: with the 408 the server sends at
// a request's expiry, on which the app asks again (now the server). It
// does not pass the rest of the request on: what is left of its expiry
// may be too short for its heartbeat, which the server refuses with a 400
// that ends nats.go's Consume.
func (c *conn) endEarly(h *heldPull, left int) {
	c.lastStatus(h, h.status("408", "Request Timeout", left))
}

// servePull answers the app's pull request h from the log on a target:
// with up to its batch of records; once the consumer is switched, what is
// left of it with a 408, on which the app asks the server; at its expiry,
// with the 408 the server sends then.
func (c *conn) servePull(ctx context.Context, h *heldPull) {
	k := c.p.rp.key(h.stream, h.consumer)
	c.startReplaying(k)
	ctx, cancel := c.pullContext(ctx, h)
	defer cancel()
	left := h.req.Batch
	for left > 0 {
		if k.isSwitched() {
			c.endEarly(h, left)
			return
		}
		wake := k.wake()
		if !k.lockFeed(ctx) {
			c.endPull(ctx, h, left)
			return
		}
		sent, done, err := c.replayRun(ctx, k, h.sid, left, h.req.NoWait)
		k.unlockFeed()
		left -= sent
		switch {
		case errors.Is(err, errNoWaitEmpty) && ctx.Err() == nil: // nothing there yet
			c.lastStatus(h, h.status("404", "No Messages", -1))
			return
		case err != nil:
			c.endPull(ctx, h, left)
			return
		case done == sentOne:
		case done == doneAll:
			c.p.switchKey(k)
		case h.req.NoWait:
			c.lastStatus(h, h.status("404", "No Messages", -1))
			return
		default:
			if !waitOn(ctx, wake) {
				c.endPull(ctx, h, left)
				return
			}
		}
	}
}

// pullContext ends at h's expiry (or with the connection), and sends idle
// heartbeats meanwhile if h asked for them.
func (c *conn) pullContext(ctx context.Context, h *heldPull) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if h.deadline.IsZero() {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithDeadline(ctx, h.deadline)
	}
	if hb := time.Duration(h.req.Heartbeat); hb > 0 {
		hb = max(hb, 100*time.Millisecond)
		go func() {
			t := time.NewTicker(hb)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					c.heartbeat(h)
				}
			}
		}()
	}
	return ctx, cancel
}

// endPull answers a pull request whose expiry passed with left messages
// not sent; it sends nothing if the connection went.
func (c *conn) endPull(ctx context.Context, h *heldPull, left int) {
	if c.isAborted() || !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return
	}
	c.lastStatus(h, h.status("408", "Request Timeout", left))
}

// holdPull answers the app's pull request h while the proxy is quiesced
// or stopped: the sidecar keeps it from the server and, at its expiry,
// answers 408 as the server would; if the proxy serves again first, it
// answers 408 at once, and the app asks the server.
func (c *conn) holdPull(ctx context.Context, h *heldPull) {
	ctx, cancel := c.pullContext(ctx, h)
	defer cancel()
	if h.req.NoWait {
		c.lastStatus(h, h.status("404", "No Messages", -1))
		return
	}
	for {
		wake := c.p.modeWake()
		if c.p.Mode() == proxy.Serving {
			c.endEarly(h, h.req.Batch)
			return
		}
		if !waitOn(ctx, wake) {
			c.endPull(ctx, h, h.req.Batch)
			return
		}
	}
}

// endReplay puts back what this connection had in flight of the replay
// when it ends, and counts an interrupted replay.
func (c *conn) endReplay() {
	if c.p.rp == nil {
		return
	}
	c.subMu.Lock()
	keys := make([]*keyReplay, 0, len(c.replaying))
	for k := range c.replaying {
		keys = append(keys, k)
	}
	for _, f := range c.feeds {
		f.cancel()
	}
	c.subMu.Unlock()
	settled := c.replaySettled.Load()
	for _, k := range keys {
		k.dropConn(c)
		c.stopReplaying(k)
	}
	if len(keys) > 0 && settled > 0 {
		c.p.rp.mu.Lock()
		c.p.rp.interrupted++
		c.p.rp.mu.Unlock()
		c.log.Warn("the app's connection went away in the middle of the replay, after it had settled replayed deliveries: an app restarted from the checkpoint would lack them", "settled", settled)
	}
}

// absorbPublish absorbs the app's publish m during replay: the source made
// it already. A publish that waits for a JetStream publish ack gets one,
// marked duplicate, from the sidecar.
func (c *conn) absorbPublish(ctx context.Context, m *natswire.Msg) {
	r := c.p.rp
	subject := string(m.Subject)
	r.mu.Lock()
	if len(r.suppressed) < maxSubs {
		r.suppressed[subject]++
	}
	stream, known := r.streamOf[subject]
	r.mu.Unlock()
	if len(m.Reply) == 0 {
		return
	}
	if !known {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, ok, err := r.lookup.StreamOf(lctx, subject)
		cancel()
		if err != nil {
			c.log.Warn("cannot find the stream of an absorbed publish; the app gets no publish ack", "subject", subject, "err", err)
			return
		}
		if !ok {
			s = ""
		}
		stream = s
		r.mu.Lock()
		if len(r.streamOf) < maxSubs {
			r.streamOf[subject] = stream
		}
		r.mu.Unlock()
	}
	if stream == "" {
		return // a core request: nothing the sidecar can answer for
	}
	sid := c.sidFor(string(m.Reply))
	if sid == nil {
		return
	}
	body, _ := json.Marshal(struct {
		Stream    string `json:"stream"`
		Seq       uint64 `json:"seq"`
		Duplicate bool   `json:"duplicate"`
	}{stream, 0, true})
	_ = c.writeApp(natswire.AppendMsg(nil, m.Reply, sid, nil, nil, body))
}

// isAppPublish reports whether a publish on subject is the app's own data
// (not a JetStream API request, an ack, or a reply to a request).
func isAppPublish(subject []byte) bool {
	return !bytes.HasPrefix(subject, []byte("$")) && !bytes.HasPrefix(subject, []byte("_INBOX."))
}

// noTeeYet reports whether a target must not tee a message yet: its tee
// continues the log only once the cutoff is known.
func (c *conn) noTeeYet() bool {
	return c.p.rp != nil && !c.p.teeReady()
}

// onPong counts a PONG from the server and reports whether it answers the
// proxy's own PING. Called by the downstream pump.
func (c *conn) onPong() bool {
	c.pongsSeen++
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	if c.flushAt != 0 && c.pongsSeen == c.flushAt {
		c.flushAt = 0
		close(c.flushed)
		return true
	}
	return false
}

// endJS takes the app's JetStream subscriptions off the server (UNSUB on
// its behalf: a push consumer stops pushing, and the server drops the
// app's open pull requests, whose reply subject has no interest any more),
// then waits until the server has answered a PING sent after them: every
// delivery the server made before has then arrived (and is held, the
// proxy being quiesced).
func (c *conn) endJS(ctx context.Context) error {
	c.mu.Lock()
	js := make(map[string]bool, len(c.jsSIDs))
	for sid := range c.jsSIDs {
		js[sid] = true
	}
	c.mu.Unlock()
	c.subMu.Lock()
	var out []byte
	for sid, s := range c.subs {
		if (js[sid] || s.pull) && !s.unsubscribed {
			out = natswire.AppendUnsub(out, []byte(sid), 0)
			s.unsubscribed = true
			c.subs[sid] = s
		}
	}
	c.subMu.Unlock()
	return c.flushUp(ctx, out)
}

// flushUp writes out to the server, outside the queue of the app's
// chunks, followed by a PING, and waits for its PONG: the server has then
// read out and sent everything it was to send before. It returns at once,
// nil, if the connection is gone.
func (c *conn) flushUp(ctx context.Context, out []byte) error {
	done := make(chan struct{})
	c.upMu.Lock()
	c.flushMu.Lock()
	c.flushAt, c.flushed = c.pingsSent+1, done
	c.flushMu.Unlock()
	out = natswire.AppendPing(out)
	_, err := c.up.Write(out)
	c.pingsSent++
	c.upMu.Unlock()
	if err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-c.aborted:
		return nil // the connection is gone: nothing more comes on it
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// returnHeld gives the JetStream deliveries this connection holds back
// from the app (quiesced) to the server again, for a proxy about to close:
// it takes the app's JetStream subscriptions off the server (endJS), so
// that nothing more is delivered, and then naks every held delivery, in
// the order the server made them, and waits until the server has read the
// naks. The server then gives them, ahead of later messages, to the next
// pull or push of the consumer: without the naks they would come back
// only after the consumer's ack wait, behind the messages delivered
// meanwhile, and a consumer that folds them in order would fold them out
// of order. A held delivery was never teed nor handed to the app. It
// returns how many it gave back.
func (c *conn) returnHeld(ctx context.Context) (int, error) {
	if err := c.endJS(ctx); err != nil {
		return 0, err
	}
	c.mu.Lock()
	held := c.held
	c.held = nil
	c.mu.Unlock()
	if len(held) == 0 {
		return 0, nil
	}
	var out []byte
	n := 0
	parser := natswire.NewParser(natswire.HardMaxPayload)
	for _, raw := range held {
		_ = parser.Parse(raw, func(m *natswire.Msg) error { // held only once parsed whole
			out = natswire.AppendPub(out, m.Reply, nil, nil, nakBody)
			n++
			return nil
		})
	}
	if err := c.flushUp(ctx, out); err != nil {
		return 0, err
	}
	return n, nil
}

// nakBody is a JetStream negative ack: the server redelivers at once.
var nakBody = []byte("-NAK")

// resubscribe puts back the subscriptions a stop (or ReturnHeld) took off
// the server. The
// server dropped the app's pull requests with them, silently: the app is
// told with the status the server sends when it loses pull requests (409
// Leadership Change), on which nats.go asks again.
func (c *conn) resubscribe() {
	c.subMu.Lock()
	var out, toApp []byte
	for sid, s := range c.subs {
		if s.unsubscribed {
			out = append(out, s.raw...)
			s.unsubscribed = false
			c.subs[sid] = s
			if s.pull && !strings.ContainsAny(s.subject, "*>") {
				toApp = natswire.AppendMsg(toApp, []byte(s.subject), []byte(sid), nil, []byte("NATS/1.0 409 Leadership Change\r\n\r\n"), nil)
			}
		}
	}
	c.subMu.Unlock()
	if len(out) > 0 {
		c.sendUp(out)
	}
	if len(toApp) > 0 {
		_ = c.writeApp(toApp) // a failed write ends the connection anyway
	}
}
