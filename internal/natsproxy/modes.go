package natsproxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ms2m/ms2m/internal/proxy"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/tracking"
)

// Mode returns what the proxy does with new JetStream deliveries.
func (p *Proxy) Mode() proxy.Mode { return proxy.Mode(p.mode.Load()) }

// Quiesce holds new JetStream deliveries back from the app and absorbs its
// pull requests, then waits until the app has settled every delivery it
// has on a connection still open and those acks are upstream (the
// deliveries of a connection that ended are not waited for: the app that
// held them may have died; unackedSet). It returns the checkpoint ID (the
// last delivery the app was given) and the log's epoch. On error the proxy
// stays quiesced and Resume undoes it.
func (p *Proxy) Quiesce(ctx context.Context) (id, epoch uint64, err error) {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	if p.Mode() == proxy.Stopped {
		return 0, 0, fmt.Errorf("quiesce: %w; resume it first", proxy.ErrStopped)
	}
	if _, err := p.switchMode(proxy.Quiesced); err != nil {
		return 0, 0, err
	}
	if err := p.waitSettled(ctx); err != nil {
		return 0, 0, err
	}
	st := p.tee.Status()
	p.log.Info("quiesced", "checkpoint_id", st.LastID, "epoch", st.Epoch)
	return st.LastID, st.Epoch, nil
}

// Stop ends this sidecar's tenure: the deliveries held back since a
// quiesce go to the app (in the server's order), and from then on new
// JetStream deliveries are dropped (the server redelivers them, after the
// consumer's ack wait, to whoever consumes next) and the app's pull
// requests are absorbed. It waits until the app has settled all it has
// on the connections still open, then writes a cutoff marker with the last
// delivery ID and returns once the marker is durable. An ack that comes
// after the stop, for a delivery of a connection that ended, still goes to
// the server: its record is before the cutoff, and a target replays the
// records up to the cutoff whether the app acked them or not.
func (p *Proxy) Stop(ctx context.Context) (proxy.StopResult, error) {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	if p.Mode() == proxy.Stopped {
		return proxy.StopResult{CutoffID: p.cutoffID, Epoch: p.stopEpoch, StoppedAt: p.stopAt}, nil
	}
	started := time.Now()
	// Hold deliveries, take the app's JetStream subscriptions off the
	// server and wait for what it sent before, so that nothing reaches
	// this sidecar after the stop: a delivery dropped then would come back
	// to the next consumer after its ack wait, behind later messages.
	if _, err := p.switchMode(proxy.Quiesced); err != nil {
		return proxy.StopResult{}, err
	}
	for _, c := range p.snapshotConns() {
		if err := c.endJS(ctx); err != nil {
			return proxy.StopResult{}, fmt.Errorf("stop: take the app's JetStream subscriptions off the server: %w; POST /resume puts them back", err)
		}
	}
	held, err := p.switchMode(proxy.Stopped)
	if err != nil {
		return proxy.StopResult{}, err
	}
	if err := p.waitSettled(ctx); err != nil {
		return proxy.StopResult{}, err
	}
	recovered, err := p.recoverVoid(ctx)
	if err != nil {
		return proxy.StopResult{}, fmt.Errorf("stop: read back the push deliveries made to no one during the stop: %w; POST /resume puts the subscriptions back", err)
	}
	id, epoch, tk := p.tee.AppendCutoff(p.cutoffKeys(ctx))
	if err := p.tee.Wait(ctx, tk); err != nil {
		return proxy.StopResult{}, fmt.Errorf("write the cutoff marker (cutoff ID %d) to the replay log: %w", id, err)
	}
	now := time.Now()
	p.mu.Lock()
	p.cutoffID, p.stopEpoch, p.stopAt = id, epoch, now
	p.mu.Unlock()
	p.log.Info("stopped", "cutoff_id", id, "epoch", epoch, "held", held, "recovered", recovered)
	return proxy.StopResult{StartedAt: started, CutoffID: id, Epoch: epoch, Held: held, Recovered: recovered, StoppedAt: now}, nil
}

// StartStopped makes a proxy that serves no app yet stopped at r, a stop
// that a previous run of the sidecar made and recorded: the app's
// JetStream subscriptions and pull requests are absorbed, as after Stop,
// and Resume puts them on the server. Call it before Serve.
func (p *Proxy) StartStopped(r proxy.StopResult) {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	_, _ = p.switchMode(proxy.Stopped) // no connection yet: nothing to release
	p.mu.Lock()
	p.cutoffID, p.stopEpoch, p.stopAt = r.CutoffID, r.Epoch, r.StoppedAt
	p.mu.Unlock()
}

// Resume hands deliveries to the app again; after a Stop it first writes a
// resume marker that voids the cutoff.
func (p *Proxy) Resume(ctx context.Context) error {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	was := p.Mode()
	if was == proxy.Serving {
		return nil
	}
	if was == proxy.Stopped {
		_, _, tk := p.tee.AppendMarker(shadowqueue.KindResume)
		if err := p.tee.Wait(ctx, tk); err != nil {
			return fmt.Errorf("write the resume marker to the replay log: %w", err)
		}
	}
	if _, err := p.switchMode(proxy.Serving); err != nil {
		return err
	}
	for _, c := range p.snapshotConns() {
		c.resubscribe() // what a stop or ReturnHeld took off the server
	}
	p.log.Info("resumed", "from", was.String())
	return nil
}

// ReturnHeld gives the JetStream deliveries held back from the app since
// a quiesce to the server again, for a proxy that is about to close
// quiesced (the sidecar's drain at SIGTERM): each connection takes the
// app's JetStream subscriptions off the server and naks what it holds, so
// that the server redelivers those messages at once, ahead of later ones,
// to whoever consumes next (conn.returnHeld). It does nothing unless the
// proxy is quiesced. Resume puts the subscriptions back. It returns how
// many deliveries it gave back.
func (p *Proxy) ReturnHeld(ctx context.Context) (int, error) {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	if p.Mode() != proxy.Quiesced {
		return 0, nil
	}
	n := 0
	var errs []error
	for _, c := range p.snapshotConns() {
		k, err := c.returnHeld(ctx)
		n += k
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("give the held deliveries back to the server (%d given): %w", n, errors.Join(errs...))
	}
	if n > 0 {
		p.log.Info("gave the deliveries held back from the app to the server again", "deliveries", n)
	}
	return n, nil
}

// switchMode sets the mode of the proxy and of every connection, and
// returns how many held deliveries went to the app.
func (p *Proxy) switchMode(m proxy.Mode) (released int, err error) {
	p.mu.Lock()
	p.mode.Store(int32(m))
	close(p.modeCh)
	p.modeCh = make(chan struct{})
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		n, cerr := c.setMode(m)
		released += n
		if cerr != nil && err == nil {
			err = fmt.Errorf("hand the held deliveries to the app: %w", cerr)
			c.abort()
		}
	}
	return released, err
}

func (p *Proxy) snapshotConns() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	return conns
}

// waitSettled waits until the app has settled every delivery it was given
// on a connection still open, and every ack is written upstream.
func (p *Proxy) waitSettled(ctx context.Context) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		unacked := p.unacked.awaited()
		queued := int64(0)
		p.mu.Lock()
		for c := range p.conns {
			queued += c.queued.Load()
		}
		p.mu.Unlock()
		if unacked == 0 && queued == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the app to ack its %d JetStream deliveries in flight (%d chunks queued for the server): %w", unacked, queued, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// State is a snapshot, in the AMQP proxy's shape so that the control API
// serves both.
func (p *Proxy) State() proxy.State {
	p.mu.Lock()
	conns := len(p.conns)
	held := 0
	for c := range p.conns {
		h, _ := c.heldCount()
		held += h
	}
	cutoff, epoch := p.cutoffID, p.stopEpoch
	p.mu.Unlock()
	st := p.tee.Status()
	s := proxy.State{
		Mode: p.Mode().String(), Connections: conns, Held: held, Log: st, Degraded: st.Degraded,
	}
	if p.Mode() == proxy.Stopped {
		s.CutoffID, s.Epoch = cutoff, epoch
	}
	queues := p.tracker.Snapshot(time.Now())
	if p.rp == nil {
		s.Queues = queues
		return s
	}
	rest := make(map[string]tracking.QueueStats, len(queues))
	for _, q := range queues {
		rest[q.Queue] = q
	}
	p.replayState(&s, rest)
	for _, q := range queues { // the consumers not replayed, in order
		if _, ok := rest[q.Queue]; ok {
			s.Queues = append(s.Queues, q)
		}
	}
	return s
}
