package proxy

import "github.com/ms2m/ms2m/internal/amqpwire"

// Ack coalescing. An app that acks each delivery on its own sends the broker
// one basic.ack per message, and the broker's channel and queue handle each
// one. When acks pile up behind the replay log (or simply arrive together),
// the sidecar writes a run of them as one cumulative ack: basic.ack with
// multiple=true and the last tag of the run. That is exact only when the
// broker has nothing else unacked on the channel up to that tag, so an ack
// is marked cumulative only then (conn.cumulative), and only acks next to
// each other in what goes upstream are merged.

// cumAck is a cumulative basic.ack at the end of a byte run bound for the
// broker: its channel and tag, and where its frame lies in the run.
type cumAck struct {
	ok         bool
	ch         uint16
	tag        uint64
	start, end int
}

// last reports whether the ack is the last frame of run.
func (a cumAck) last(run []byte) bool { return a.ok && a.end == len(run) }

// appendAck appends an ack frame to run. A cumulative ack (cumulative set,
// tag above the last one's) that directly follows another one on the same
// channel replaces it with basic.ack(tag, multiple=true), and merged is
// true; otherwise frame goes on as it is. tail is updated either way.
func appendAck(run []byte, tail *cumAck, ch uint16, tag uint64, frame []byte, cumulative bool) (out []byte, merged bool) {
	if cumulative && tail.last(run) && tail.ch == ch && tag > tail.tag {
		run = amqpwire.AppendMethodFrame(run[:tail.start], ch, &amqpwire.BasicAck{DeliveryTag: tag, Multiple: true})
		tail.tag, tail.end = tag, len(run)
		return run, true
	}
	start := len(run)
	run = append(run, frame...)
	if cumulative {
		*tail = cumAck{ok: true, ch: ch, tag: tag, start: start, end: len(run)}
	} else {
		*tail = cumAck{}
	}
	return run, false
}

// unackedUpTo reports whether the broker may still hold a delivery with a
// tag up to tag unacked on the channel, besides what the app has settled:
// one the app has not settled, one held back from it, or one still arriving.
// A renumbered channel (replay) is never coalesced.
func (ch *channel) unackedUpTo(tag uint64) bool {
	if ch.renumber {
		return true
	}
	// Both lists are in the broker's tag order.
	if len(ch.outstanding) > 0 && ch.outstanding[0].upTag <= tag {
		return true
	}
	if len(ch.held) > 0 && ch.held[0].upTag <= tag {
		return true
	}
	return ch.down != nil && ch.down.record && ch.down.upTag <= tag
}

// cumulative reports whether the app's ack of tag, which settled something,
// may go upstream as a cumulative ack: the connection serves (no held
// deliveries being given back, no frames of the sidecar's own waiting), the
// tag is a real one, and nothing else is unacked up to it. c.mu is held.
func (c *conn) cumulative(ch *channel, tag uint64) bool {
	return c.mode == Serving && !c.requeued && len(c.late) == 0 && tag != 0 && !ch.unackedUpTo(tag)
}
