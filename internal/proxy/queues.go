package proxy

import (
	"sort"
	"strings"

	"github.com/ms2m/ms2m/internal/amqpwire"
)

// Queues that a migration cannot replay. The replay log is keyed by queue
// name, and a target's app consumes the queues it declares when it
// reconnects; a queue that does not outlive the source's connection or
// consumers, or whose name the broker chose, is not there for it.
const (
	reasonServerNamed = "server-named (amq.gen-*): the restored app declares a new queue with another name, which the replay log knows nothing of"
	reasonExclusive   = "exclusive: it belongs to the app's connection, which the checkpoint's restore closes, so the broker deletes it with its messages"
	reasonAutoDelete  = "auto-delete: the broker deletes it when its last consumer is cancelled, as the migration's stop does, with the messages still in it"
)

// UnreplayableQueue is a queue the app consumes that a migration cannot
// carry over, and why.
type UnreplayableQueue struct {
	Queue  string `json:"queue"`
	Reason string `json:"reason"`
}

// pendingDeclare is a queue.declare that waits for its declare-ok, which
// carries the name the broker gave.
type pendingDeclare struct {
	reason string // "" for a passive or ordinary declare
}

// declareReason is why a declared queue cannot be replayed, or "".
func declareReason(m *amqpwire.QueueDeclare) string {
	switch {
	case m.Passive:
		return ""
	case m.Queue == "":
		return reasonServerNamed
	case m.Exclusive:
		return reasonExclusive
	case m.AutoDelete:
		return reasonAutoDelete
	}
	return ""
}

// onQueueDeclare notes an app's queue.declare, with c.mu held.
func (c *conn) onQueueDeclare(ch *channel, m *amqpwire.QueueDeclare) {
	reason := declareReason(m)
	if m.NoWait {
		if reason != "" && m.Queue != "" {
			c.p.noteQueue(m.Queue, reason)
		}
		return
	}
	ch.declares = append(ch.declares, pendingDeclare{reason: reason})
}

// onQueueDeclareOk pairs the broker's declare-ok with the app's declare,
// with c.mu held.
func (c *conn) onQueueDeclareOk(ch *channel, m *amqpwire.QueueDeclareOk) {
	if len(ch.declares) == 0 {
		return
	}
	d := ch.declares[0]
	ch.declares = ch.declares[1:]
	if d.reason != "" {
		c.p.noteQueue(m.Queue, d.reason)
	}
}

// noteQueue remembers why a declared queue cannot be replayed.
func (p *Proxy) noteQueue(queue, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.declared == nil {
		p.declared = map[string]string{}
	}
	p.declared[queue] = reason
}

// consumed notes that the app consumes queue on c, with c.mu held: one
// that cannot be replayed is reported in State while a connection that
// consumed it is open, so that a migrator refuses before its checkpoint.
func (c *conn) consumed(queue string) {
	if c.unreplayable[queue] {
		return
	}
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	reason := p.declared[queue]
	if reason == "" && strings.HasPrefix(queue, "amq.gen-") {
		reason = reasonServerNamed
	}
	if reason == "" {
		return
	}
	if c.unreplayable == nil {
		c.unreplayable = map[string]bool{}
	}
	c.unreplayable[queue] = true
	if p.unreplayable == nil {
		p.unreplayable = map[string]*unreplayable{}
	}
	u := p.unreplayable[queue]
	if u == nil {
		u = &unreplayable{reason: reason}
		p.unreplayable[queue] = u
	}
	u.conns++
}

// forgetConsumed drops c's share of the unreplayable queues when c ends:
// an exclusive queue ended with it, and an app that reconnects consumes
// again what it still uses. c.mu is held.
func (c *conn) forgetConsumed() {
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for q := range c.unreplayable {
		if u := p.unreplayable[q]; u != nil {
			if u.conns--; u.conns <= 0 {
				delete(p.unreplayable, q)
			}
		}
	}
	c.unreplayable = nil
}

// unreplayable is a queue consumed that cannot be replayed, and how many
// open connections consumed it.
type unreplayable struct {
	reason string
	conns  int
}

// unreplayableLocked lists the queues consumed that cannot be replayed, by
// name; p.mu is held.
func (p *Proxy) unreplayableLocked() []UnreplayableQueue {
	out := make([]UnreplayableQueue, 0, len(p.unreplayable))
	for q, u := range p.unreplayable {
		out = append(out, UnreplayableQueue{Queue: q, Reason: u.reason})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	return out
}
