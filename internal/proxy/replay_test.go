package proxy

import (
	"strings"
	"testing"

	"github.com/ms2m/ms2m/internal/amqpwire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// TestReplayable: a record the proxy cannot encode as a delivery is an
// error that names the record and the field, never a panic; a record at
// the limits passes.
func TestReplayable(t *testing.T) {
	long := strings.Repeat("k", 300)
	tests := map[string]struct {
		rec      shadowqueue.Record
		maxFrame uint32
		wantErr  string // "" = replayable
	}{
		"plain":                   {rec: shadowqueue.Record{ID: 1, Exchange: "x", RoutingKey: "k", Body: []byte("b")}},
		"short strings at 255":    {rec: shadowqueue.Record{ID: 1, Exchange: strings.Repeat("x", 255), RoutingKey: strings.Repeat("k", 255)}},
		"routing key of 300":      {rec: shadowqueue.Record{ID: 7, RoutingKey: long}, wantErr: "record ID 7: its routing key is 300 bytes"},
		"exchange of 256":         {rec: shadowqueue.Record{ID: 8, Exchange: long[:256]}, wantErr: "record ID 8: its exchange is 256 bytes"},
		"properties over frame":   {rec: shadowqueue.Record{ID: 9, Properties: make([]byte, 5000)}, maxFrame: 4096, wantErr: "do not fit the app connection's frame max of 4096"},
		"properties at the frame": {rec: shadowqueue.Record{ID: 9, Properties: make([]byte, 4096-amqpwire.FrameOverhead-12)}, maxFrame: 4096},
		"no frame max":            {rec: shadowqueue.Record{ID: 9, Properties: make([]byte, 5000)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := replayable(&tc.rec, tc.maxFrame)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("replayable = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("replayable = %v, want an error containing %q", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			// What replayable passes, the proxy encodes without panicking.
			d := &amqpwire.BasicDeliver{ConsumerTag: "c", DeliveryTag: 1, Exchange: tc.rec.Exchange, RoutingKey: tc.rec.RoutingKey}
			amqpwire.AppendMethodFrame(nil, 1, d)
		})
	}
}
