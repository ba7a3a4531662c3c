package proxy

import (
	"time"

	"github.com/ms2m/ms2m/internal/amqpwire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// consumer is one basic.consume that the broker confirmed.
type consumer struct {
	queue string
	noAck bool
	// consume is the app's basic.consume, with the consumer tag made
	// explicit, so that a resume after a stop can issue it again.
	consume *amqpwire.BasicConsume
}

// pendingConsume is a basic.consume sent upstream and not yet confirmed.
type pendingConsume struct {
	m         *amqpwire.BasicConsume
	bySidecar bool // sent by the sidecar on resume: swallow its consume-ok
	switching bool // sent by the sidecar at the end of replay
}

// pendingGet is a basic.get sent upstream and not yet answered.
type pendingGet struct {
	queue string
	noAck bool
}

// content is a content-bearing method on its way through: its header and
// body frames follow.
type content struct {
	record bool   // a delivery to tee; false for basic.return and publishes
	held   bool   // held back from the app (quiesced or stopped)
	tag    uint64 // the app's delivery tag
	upTag  uint64 // the broker's
	noAck  bool
	size   uint64
	got    uint64
	header bool
	raw    []byte // the frames, while held
	rec    shadowqueue.Record
	absorb bool        // an app publish absorbed during replay (tag is its confirm number, 0 if none)
	pub    *pubCapture // an app publish being digested for publish checking
	get    bool        // a basic.get-ok
	// check is set on a redelivery that may be absorbed (startContent):
	// its frames wait in raw, and method, with its delivery tag at tagp,
	// goes out once complete decided.
	check  bool
	method amqpwire.Method
	tagp   *uint64
}

// delivery is one delivery the app has and has not settled.
type delivery struct {
	tag    uint64 // the app's delivery tag
	upTag  uint64 // the broker's (differs once the channel is renumbered)
	id     uint64
	ticket shadowqueue.Ticket
	queue  string
	at     time.Time
	// print is the message's (printOf), and first the ID of its first
	// delivery here (id, or the Repeats of its record): if the broker
	// takes it back, its redelivery is logged as repeating first.
	print messagePrint
	first uint64
}

// channel is the proxy's view of one AMQP channel.
type channel struct {
	id        uint16
	consumers map[string]*consumer
	consumes  []pendingConsume
	declares  []pendingDeclare // the app's queue.declares awaiting declare-ok
	gets      []pendingGet
	down      *content // content in progress from the broker
	up        *content // content in progress from the app (publishes)
	// outstanding holds the deliveries the app has not settled, in tag
	// order (the broker numbers them upward per channel).
	outstanding []delivery
	// held holds complete deliveries that the app has not been given.
	held []*content
	// cancelled holds the consumers the sidecar cancelled on stop, for resume.
	cancelled []*consumer
	// awaitCancelOk counts the sidecar's own basic.cancel still unanswered.
	awaitCancelOk map[string]bool
	prefetch      uint16
	nextTag       int // for consumer tags the sidecar makes up

	// Replay (target sidecars only). replaying holds the app's consumers
	// served from the log; replayOut the replayed deliveries the app has not
	// settled. Once a channel has carried a replayed delivery, renumber is
	// set and the sidecar assigns every delivery tag the app sees on it:
	// appTag is the last one.
	replaying map[string]*replayConsumer
	replayOut []replayDelivery
	renumber  bool
	appTag    uint64
	// replayDone counts the replayed deliveries the app settled for good
	// on this channel (acked, rejected without requeue, or taken with
	// no-ack): the records a later consumer will not get again.
	replayDone int

	// Publisher confirms. confirm is set by the app's confirm.select; pubSeq
	// is the app's last publish sequence number; absorbed counts the
	// publishes the sidecar absorbed during replay and confirmed itself, by
	// which the broker's confirm numbers lag the app's.
	confirm  bool
	pubSeq   uint64
	absorbed uint64
}

func newChannel(id uint16) *channel {
	return &channel{id: id, consumers: map[string]*consumer{}, awaitCancelOk: map[string]bool{}, replaying: map[string]*replayConsumer{}}
}

// settle removes and returns the outstanding deliveries that an ack, nack or
// reject of tag covers. With multiple, that is every delivery up to tag, and
// tag 0 means all of them.
func (ch *channel) settle(tag uint64, multiple bool) []delivery {
	if !multiple {
		for i, d := range ch.outstanding {
			if d.tag == tag {
				ch.outstanding = append(ch.outstanding[:i], ch.outstanding[i+1:]...)
				return []delivery{d}
			}
		}
		return nil
	}
	n := len(ch.outstanding)
	if tag != 0 {
		n = 0
		for n < len(ch.outstanding) && ch.outstanding[n].tag <= tag {
			n++
		}
	}
	covered := make([]delivery, n)
	copy(covered, ch.outstanding[:n])
	ch.outstanding = append(ch.outstanding[:0], ch.outstanding[n:]...)
	return covered
}
