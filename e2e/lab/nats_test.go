package lab

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestNATSProducerChain(t *testing.T) {
	// PrefixHash is checked against an independent computation
	// (TestCheckPrefix); the producer's running fold must agree with it.
	var h chain
	if got, want := h.hex(), PrefixHash(0); got != want {
		t.Fatalf("empty chain = %s, want %s", got, want)
	}
	for i := 1; i <= 5; i++ {
		h.add(fmt.Appendf(nil, "msg-%d", i))
		if got, want := h.hex(), PrefixHash(i); got != want {
			t.Fatalf("chain after msg-%d = %s, want %s", i, got, want)
		}
	}
}

func TestNATSConsumerConfig(t *testing.T) {
	pull, err := natsConsumerConfig("s", "pull")
	if err != nil || pull.Durable != NATSDurable || pull.DeliverSubject != "" {
		t.Errorf("pull: %+v, %v; want the durable %s with no deliver subject", pull, err, NATSDurable)
	}
	push, err := natsConsumerConfig("s", "push")
	if err != nil || push.Durable != NATSDurable || push.DeliverSubject != "deliver.s" {
		t.Errorf("push: %+v, %v; want the durable %s on deliver.s", push, err, NATSDurable)
	}
	for _, mode := range []string{"", "Pull", "fetch"} {
		if _, err := natsConsumerConfig("s", mode); err == nil {
			t.Errorf("mode %q: no error", mode)
		}
	}
}

func TestCheckNATSInfo(t *testing.T) {
	for line, want := range map[string]string{
		`INFO {"server_id":"x","jetstream":true,"max_payload":1048576}` + "\r\n": "",
		`INFO {"server_id":"x","max_payload":1048576}` + "\r\n":                  "without JetStream",
		`INFO {"server_id":"x","jetstream":false}` + "\r\n":                      "without JetStream",
		"HTTP/1.1 400 Bad Request\r\n":                                           "not a NATS server",
		"AMQP\x00\x00\x09\x01":                                                   "not a NATS server",
	} {
		err := checkNATSInfo("127.0.0.1:4222", line)
		switch {
		case want == "" && err != nil:
			t.Errorf("%q: %v", line, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%q: error %v, want one saying %q", line, err, want)
		}
	}
}

// TestNATSMessageStamps: the producer's message carries what the NATS
// sample consumer journals, under the names it reads.
func TestNATSMessageStamps(t *testing.T) {
	sent := time.Unix(100, 5)
	m := natsMessage("s.in", 42, []byte("msg-42"), sent)
	if m.Subject != "s.in" || string(m.Data) != "msg-42" || m.Header.Get("Nats-Msg-Id") != "42" || m.Header.Get("x-sent-at") != "100000000005" {
		t.Errorf("message %q %q headers %v, want s.in, msg-42, Nats-Msg-Id 42, x-sent-at 100000000005", m.Subject, m.Data, m.Header)
	}
}
