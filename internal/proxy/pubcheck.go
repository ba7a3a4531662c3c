package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"slices"

	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// Publish checking (Options.CheckPublishes) tells a non-deterministic app
// apart from a deterministic one. A serving sidecar records every app
// publish in the log, attributed to the delivery the app was handling; a
// target sidecar attributes each publish it absorbs during replay the same
// way, and compares the two per delivery once the app has acked it.
//
// Attribution: a publish belongs to the oldest delivery the app has not
// settled on the publishing channel, else on the connection, else to the
// last delivery the app acked. That is exact for an app that handles one
// message at a time and publishes before it acks, which is what an
// at-least-once consumer does.

// ExpectedPublishes is implemented by a ReplaySource that can say what the
// source published per delivery ID. ok is false until that is known: the
// source's cutoff marker has been read.
type ExpectedPublishes interface {
	ExpectedPublishes() (byID map[uint64][]shadowqueue.Publish, ok bool)
}

// maxMismatches bounds the mismatches kept for /state.
const maxMismatches = 20

// pubCapture digests an app publish as its body goes by.
type pubCapture struct {
	forID      uint64
	exchange   string
	routingKey string
	sum        hash.Hash
}

func newPubCapture(forID uint64, exchange, routingKey string) *pubCapture {
	return &pubCapture{forID: forID, exchange: exchange, routingKey: routingKey, sum: sha256.New()}
}

func (pc *pubCapture) publish() shadowqueue.Publish {
	p := shadowqueue.Publish{Exchange: pc.exchange, RoutingKey: pc.routingKey}
	pc.sum.Sum(p.Digest[:0])
	return p
}

// attribute returns the delivery ID an app publish on ch is attributed to,
// or 0 if the app has had no delivery yet. Callers hold c.mu.
func (c *conn) attribute(ch *channel) uint64 {
	if id := oldestUnsettled(ch); id != 0 {
		return id
	}
	var oldest uint64
	for _, other := range c.chans {
		if id := oldestUnsettled(other); id != 0 && (oldest == 0 || id < oldest) {
			oldest = id
		}
	}
	if oldest != 0 {
		return oldest
	}
	return c.p.lastAcked.Load()
}

func oldestUnsettled(ch *channel) uint64 {
	var id uint64
	for _, r := range ch.replayOut {
		if id == 0 || r.id < id {
			id = r.id
		}
	}
	for _, d := range ch.outstanding {
		if id == 0 || d.id < id {
			id = d.id
		}
	}
	return id
}

// recordsPublishes reports whether app publishes go into the log: publish
// checking is on, and a target has taken the log over from the source.
func (p *Proxy) recordsPublishes() bool {
	return p.opts.CheckPublishes && (p.opts.Replay == nil || p.teeContinued.Load())
}

// pubCheck is a target's comparison state. Guarded by Proxy.mu.
type pubCheck struct {
	observed map[uint64][]shadowqueue.Publish // absorbed publishes by delivery ID
	settled  []uint64                         // replayed deliveries acked, not compared yet
	checked  uint64
	mismatch uint64
	examples []PublishMismatch
}

// observe records an absorbed publish.
func (p *Proxy) observe(forID uint64, pub shadowqueue.Publish) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pubs.observed == nil {
		p.pubs.observed = map[uint64][]shadowqueue.Publish{}
	}
	p.pubs.observed[forID] = append(p.pubs.observed[forID], pub)
}

// replayAcked records that the app acked replayed delivery id; its
// publishes are compared once the source's are known.
func (p *Proxy) replayAcked(id uint64) {
	p.lastAcked.Store(id)
	if !p.opts.CheckPublishes {
		return
	}
	p.mu.Lock()
	p.pubs.settled = append(p.pubs.settled, id)
	p.mu.Unlock()
	p.comparePublishes()
}

// replayRequeued forgets what the app published for replayed delivery id:
// it comes again, and the app will publish again.
func (p *Proxy) replayRequeued(id uint64) {
	if !p.opts.CheckPublishes {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pubs.observed, id)
}

// comparePublishes compares every acked replayed delivery, once the
// source's publishes are known.
func (p *Proxy) comparePublishes() {
	src, ok := p.opts.Replay.(ExpectedPublishes)
	if !ok || !p.opts.CheckPublishes {
		return
	}
	want, ok := src.ExpectedPublishes()
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range p.pubs.settled {
		got := p.pubs.observed[id]
		delete(p.pubs.observed, id)
		p.pubs.checked++
		p.opts.Metrics.pubChecked.Inc()
		if slices.Equal(want[id], got) {
			continue
		}
		p.pubs.mismatch++
		p.opts.Metrics.pubMismatches.Inc()
		m := PublishMismatch{ID: id, Source: summarize(want[id]), Target: summarize(got)}
		if len(p.pubs.examples) < maxMismatches {
			p.pubs.examples = append(p.pubs.examples, m)
			p.log.Warn("the app published differently while handling a replayed message than the source did: it is not deterministic in handling it, so its replayed state may differ too",
				"delivery_id", id, "source", m.Source, "target", m.Target)
		}
	}
	p.pubs.settled = p.pubs.settled[:0]
}

// PublishCheck is the outcome of publish checking on a target.
type PublishCheck struct {
	// Checked counts the replayed deliveries whose publishes were compared.
	Checked uint64 `json:"checked"`
	// Mismatched counts those whose publishes differed from the source's.
	Mismatched uint64 `json:"mismatched"`
	// Pending counts acked replayed deliveries waiting for the source's
	// records (they are complete once its cutoff marker is read).
	Pending int `json:"pending"`
	// Mismatches are the first few, for a human to look at.
	Mismatches []PublishMismatch `json:"mismatches,omitempty"`
}

// PublishMismatch is one replayed delivery whose publishes differed.
type PublishMismatch struct {
	ID     uint64           `json:"id"`
	Source []PublishSummary `json:"source"`
	Target []PublishSummary `json:"target"`
}

// PublishSummary names one publish.
type PublishSummary struct {
	Exchange   string `json:"exchange"`
	RoutingKey string `json:"routingKey"`
	BodySHA256 string `json:"bodySha256"`
}

func summarize(ps []shadowqueue.Publish) []PublishSummary {
	out := make([]PublishSummary, 0, len(ps))
	for _, p := range ps {
		out = append(out, PublishSummary{Exchange: p.Exchange, RoutingKey: p.RoutingKey, BodySHA256: hex.EncodeToString(p.Digest[:])})
	}
	return out
}

// publishCheckLocked returns the check's state for /state. Callers hold p.mu.
func (p *Proxy) publishCheckLocked() *PublishCheck {
	if !p.opts.CheckPublishes {
		return nil
	}
	return &PublishCheck{Checked: p.pubs.checked, Mismatched: p.pubs.mismatch, Pending: len(p.pubs.settled), Mismatches: slices.Clone(p.pubs.examples)}
}
