package amqpwire

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestAppendFrame(t *testing.T) {
	tests := map[string]struct {
		got  []byte
		want []byte
	}{
		"heartbeat": {
			got:  AppendHeartbeat(nil),
			want: []byte{8, 0, 0, 0, 0, 0, 0, 0xCE},
		},
		"body frame": {
			got:  AppendFrame(nil, FrameBody, 0x0102, []byte("hi")),
			want: []byte{3, 0x01, 0x02, 0, 0, 0, 2, 'h', 'i', 0xCE},
		},
		"empty payload": {
			got:  AppendFrame(nil, FrameBody, 1, nil),
			want: []byte{3, 0, 1, 0, 0, 0, 0, 0xCE},
		},
		"appends to dst": {
			got:  AppendHeartbeat([]byte{'x'}),
			want: []byte{'x', 8, 0, 0, 0, 0, 0, 0, 0xCE},
		},
		"raw header frame": {
			got: AppendRawHeaderFrame(nil, 1, 60, 5, []byte{0x10, 0x00, 2}),
			want: []byte{
				2, 0, 1, 0, 0, 0, 15,
				0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0x10, 0x00, 2,
				0xCE,
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestAppendBodyFrames(t *testing.T) {
	const chunk = FrameMinSize - FrameOverhead
	tests := map[string]struct {
		bodyLen      int
		maxFrame     uint32
		wantPayloads []int
	}{
		"empty body":               {bodyLen: 0, maxFrame: 4096, wantPayloads: nil},
		"one byte":                 {bodyLen: 1, maxFrame: 4096, wantPayloads: []int{1}},
		"exactly one frame":        {bodyLen: chunk, maxFrame: 4096, wantPayloads: []int{chunk}},
		"one byte over":            {bodyLen: chunk + 1, maxFrame: 4096, wantPayloads: []int{chunk, 1}},
		"three frames":             {bodyLen: 10000, maxFrame: 4096, wantPayloads: []int{chunk, chunk, 10000 - 2*chunk}},
		"odd frame-max":            {bodyLen: 10000, maxFrame: 5000, wantPayloads: []int{4992, 4992, 16}},
		"frame-max 0 is the cap":   {bodyLen: 10000, maxFrame: 0, wantPayloads: []int{10000}},
		"frame-max below minimum":  {bodyLen: 5000, maxFrame: 10, wantPayloads: []int{chunk, 5000 - chunk}},
		"RabbitMQ default 128 KiB": {bodyLen: 300000, maxFrame: 131072, wantPayloads: []int{131064, 131064, 37872}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			body := make([]byte, tc.bodyLen)
			for i := range body {
				body[i] = byte(i * 7)
			}
			wire := AppendBodyFrames(nil, 9, body, tc.maxFrame)

			var frames []gotFrame
			if err := NewParser(tc.maxFrame).Parse(wire, collect(&frames)); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			var gotPayloads []int
			var joined []byte
			for _, f := range frames {
				if f.Type != FrameBody || f.Channel != 9 {
					t.Errorf("frame type %d channel %d, want body frames on channel 9", f.Type, f.Channel)
				}
				gotPayloads = append(gotPayloads, len(f.Payload))
				joined = append(joined, f.Payload...)
			}
			if diff := cmp.Diff(tc.wantPayloads, gotPayloads); diff != "" {
				t.Errorf("payload sizes (-want +got):\n%s", diff)
			}
			if !bytes.Equal(joined, body) {
				t.Errorf("joined payloads differ from the body")
			}
		})
	}
}
