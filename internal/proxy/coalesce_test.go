package proxy

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/internal/amqpwire"
)

func ackFrame(ch uint16, tag uint64, multiple bool) []byte {
	return amqpwire.AppendMethodFrame(nil, ch, &amqpwire.BasicAck{DeliveryTag: tag, Multiple: multiple})
}

// acksIn decodes the run's frames as "ch:tag" or "ch:tag+" (multiple), or
// the method's type for anything else.
func acksIn(t *testing.T, run []byte) []string {
	t.Helper()
	var out []string
	p := amqpwire.NewParser(0)
	err := p.Parse(run, func(f amqpwire.Frame) error {
		m, err := amqpwire.DecodeMethod(f.Payload)
		if err != nil {
			return err
		}
		if a, ok := m.(*amqpwire.BasicAck); ok {
			s := cmpKey(f.Channel, a.DeliveryTag)
			if a.Multiple {
				s += "+"
			}
			out = append(out, s)
			return nil
		}
		out = append(out, "other")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func cmpKey(ch uint16, tag uint64) string {
	return fmt.Sprintf("%d:%d", ch, tag)
}

func TestAppendAck(t *testing.T) {
	type ack struct {
		ch         uint16
		tag        uint64
		cumulative bool
		other      bool // a frame that is not an ack goes in between
	}
	for name, tc := range map[string]struct {
		acks       []ack
		want       []string
		wantMerged int
	}{
		"a run of cumulative acks becomes one": {
			acks:       []ack{{ch: 1, tag: 1, cumulative: true}, {ch: 1, tag: 2, cumulative: true}, {ch: 1, tag: 3, cumulative: true}},
			want:       []string{"1:3+"},
			wantMerged: 2,
		},
		"a lone cumulative ack goes as the app sent it": {
			acks: []ack{{ch: 1, tag: 4, cumulative: true}},
			want: []string{"1:4"},
		},
		"an ack that is not cumulative is never merged, nor merges what follows": {
			acks: []ack{{ch: 1, tag: 1, cumulative: true}, {ch: 1, tag: 3}, {ch: 1, tag: 4, cumulative: true}},
			want: []string{"1:1", "1:3", "1:4"},
		},
		"another frame in between ends the run": {
			acks: []ack{{ch: 1, tag: 1, cumulative: true}, {other: true}, {ch: 1, tag: 2, cumulative: true}},
			want: []string{"1:1", "other", "1:2"},
		},
		"channels are not mixed": {
			acks:       []ack{{ch: 1, tag: 1, cumulative: true}, {ch: 2, tag: 1, cumulative: true}, {ch: 2, tag: 2, cumulative: true}},
			want:       []string{"1:1", "2:2+"},
			wantMerged: 1,
		},
		"a lower tag does not replace a higher one": {
			acks: []ack{{ch: 1, tag: 5, cumulative: true}, {ch: 1, tag: 3, cumulative: true}},
			want: []string{"1:5", "1:3"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var run []byte
			var tail cumAck
			merged := 0
			for _, a := range tc.acks {
				if a.other {
					run = append(run, amqpwire.AppendMethodFrame(nil, 1, &amqpwire.BasicQos{PrefetchCount: 1})...)
					continue
				}
				var m bool
				run, m = appendAck(run, &tail, a.ch, a.tag, ackFrame(a.ch, a.tag, false), a.cumulative)
				if m {
					merged++
				}
			}
			if d := cmp.Diff(tc.want, acksIn(t, run)); d != "" {
				t.Errorf("frames (-want +got):\n%s", d)
			}
			if merged != tc.wantMerged {
				t.Errorf("merged %d acks, want %d", merged, tc.wantMerged)
			}
		})
	}
}

func TestUnackedUpTo(t *testing.T) {
	base := func() *channel {
		ch := newChannel(1)
		ch.outstanding = []delivery{{tag: 5, upTag: 5}, {tag: 7, upTag: 7}}
		return ch
	}
	for name, tc := range map[string]struct {
		ch   func() *channel
		tag  uint64
		want bool
	}{
		"nothing unsettled below":          {ch: base, tag: 4, want: false},
		"an unsettled delivery at the tag": {ch: base, tag: 5, want: true},
		"an unsettled delivery below":      {ch: base, tag: 6, want: true},
		"a held delivery below": {ch: func() *channel {
			ch := newChannel(1)
			ch.held = []*content{{record: true, upTag: 3}}
			return ch
		}, tag: 4, want: true},
		"a delivery still arriving below": {ch: func() *channel {
			ch := newChannel(1)
			ch.down = &content{record: true, upTag: 2}
			return ch
		}, tag: 4, want: true},
		"a returned message is no delivery": {ch: func() *channel {
			ch := newChannel(1)
			ch.down = &content{}
			return ch
		}, tag: 4, want: false},
		"a renumbered channel is never coalesced": {ch: func() *channel {
			ch := newChannel(1)
			ch.renumber = true
			return ch
		}, tag: 4, want: true},
	} {
		t.Run(name, func(t *testing.T) {
			if got := tc.ch().unackedUpTo(tc.tag); got != tc.want {
				t.Errorf("unackedUpTo(%d) = %v, want %v", tc.tag, got, tc.want)
			}
		})
	}
}
