package sidecar_test

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestUnreplayableQueues: the sidecar reports the queues the app consumes
// that a migration cannot carry over (server-named, exclusive,
// auto-delete), by name and reason, in /state, so that the migrator
// refuses before its checkpoint; a named durable queue is not reported.
func TestUnreplayableQueues(t *testing.T) {
	var named string // set per case from e.queue
	tests := map[string]struct {
		declare    func(ch *amqp.Channel) (string, error)
		wantReason string // "" when the queue is fine
	}{
		"server-named exclusive": {
			declare: func(ch *amqp.Channel) (string, error) {
				q, err := ch.QueueDeclare("", false, true, true, false, nil)
				return q.Name, err
			},
			wantReason: "server-named",
		},
		"named exclusive": {
			declare: func(ch *amqp.Channel) (string, error) {
				q, err := ch.QueueDeclare(testenv.UniqueName("ms2m-test-excl"), false, false, true, false, nil)
				return q.Name, err
			},
			wantReason: "exclusive",
		},
		"named auto-delete": {
			declare: func(ch *amqp.Channel) (string, error) {
				q, err := ch.QueueDeclare(testenv.UniqueName("ms2m-test-autodel"), false, true, false, false, nil)
				return q.Name, err
			},
			wantReason: "auto-delete",
		},
		"named, neither exclusive nor auto-delete": {
			declare: func(ch *amqp.Channel) (string, error) {
				q, err := ch.QueueDeclare(named, false, false, false, false, nil) // as e.queue declared it
				return q.Name, err
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.start(sidecar.Options{})
			named = e.queue()
			c := e.dial(amqp.Config{})
			ch, err := c.Channel()
			if err != nil {
				t.Fatal(err)
			}
			q, err := tc.declare(ch)
			if err != nil {
				t.Fatalf("declare through the sidecar: %v", err)
			}
			if _, err := ch.Consume(q, "", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			var st struct {
				Unreplayable []struct {
					Queue  string `json:"queue"`
					Reason string `json:"reason"`
				} `json:"unreplayable"`
			}
			// The consume is on the wire once it returned: the sidecar saw it.
			e.call("GET", "/state", &st)
			if tc.wantReason == "" {
				if len(st.Unreplayable) != 0 {
					t.Fatalf("unreplayable = %+v, want none", st.Unreplayable)
				}
				return
			}
			if len(st.Unreplayable) != 1 || st.Unreplayable[0].Queue != q || !strings.HasPrefix(st.Unreplayable[0].Reason, tc.wantReason) {
				t.Fatalf("unreplayable = %+v, want queue %q: %s…", st.Unreplayable, q, tc.wantReason)
			}
			// Once the app's connection is gone, so is the report: an
			// exclusive queue went with it, and an app that reconnects
			// consumes again what it still uses.
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			unreplayable := func() int {
				st.Unreplayable = nil // absent from the answer when there is none
				e.call("GET", "/state", &st)
				return len(st.Unreplayable)
			}
			for unreplayable() > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("unreplayable = %+v 10 s after the app's connection closed, want none", st.Unreplayable)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
