package sidecar_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
)

// TestNATSTargetHoldsTheClonedPullInbox: a restored app's pull inbox is
// its source's, byte for byte (CRIU restores nats.go's memory), so the
// target's subscription to it keeps the source's open pull request alive
// on the server after the source's stop takes its own off. A message
// published then went to the target before it knew the cutoff, which
// dropped it, and the server gave it again only after the ack wait (30 s),
// behind later messages: the out-of-order ms2m-cutoff run of docs/nats.md.
// The target keeps the inbox off the server while it answers the app's
// pull requests from the log, so that the message waits at the server and
// the target's app gets it at its first pull after the switch.
func TestNATSTargetHoldsTheClonedPullInbox(t *testing.T) {
	ctx := t.Context()
	pair := newNATSPair(t, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second}, false)
	js, work, source, target := pair.js, pair.work, pair.source, pair.target
	connect := func(sc *sidecar.Sidecar) *nats.Conn {
		nc, err := nats.Connect("nats://" + sc.AMQPAddr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	src, dst := connect(source), connect(target)
	const inbox = "_INBOX.restored.1" // the same on both sides
	pull := "$JS.API.CONSUMER.MSG.NEXT." + work + ".worker"
	srcGot, dstGot := make(chan *nats.Msg, 64), make(chan *nats.Msg, 64)
	srcSub, err := src.ChanSubscribe(inbox, srcGot)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dst.ChanSubscribe(inbox, dstGot); err != nil {
		t.Fatal(err)
	}
	// Both apps wait on a pull request: the source's at the server, the
	// target's answered from the log (nothing there yet).
	for _, nc := range []*nats.Conn{src, dst} {
		if err := nc.PublishRequest(pull, inbox, []byte(`{"batch":1,"expires":30000000000}`)); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// The source's interest ends, as at the stop's UNSUB, and a message
	// comes before the target knows the cutoff.
	if err := srcSub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := src.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, work+".in", []byte("m1")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the time the server had to route it; not a wait for an outcome
	if _, err := (control.Client{URL: "http://" + source.ControlAddr(), Token: token}).Stop(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// The target switches the consumer (no record to replay) and ends the
	// held request with a 408; its app asks again, now the server.
	pullsM1(t, pair, dst, dstGot, inbox)
}

// pullsM1 waits up to 10 s for the app dst, whose pull inbox inbox feeds
// got, to get m1 from the pair's consumer, pulling again after each status
// (a 408 ends a request the target answered); the consumer's ack wait is
// 30 s, so m1 lost to no one would come only after the test fails.
func pullsM1(t *testing.T, pair natsPair, dst *nats.Conn, got <-chan *nats.Msg, inbox string) {
	t.Helper()
	pull := "$JS.API.CONSUMER.MSG.NEXT." + pair.work + ".worker"
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case m := <-got:
			if len(m.Data) == 0 {
				if err := dst.PublishRequest(pull, inbox, []byte(`{"batch":1,"expires":2000000000}`)); err != nil {
					t.Fatal(err)
				}
				continue // a status: ask again
			}
			if string(m.Data) != "m1" {
				t.Fatalf("the target's app got %q, want m1", m.Data)
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	ci, _ := pair.js.Consumer(t.Context(), pair.work, "worker")
	info, _ := ci.Info(t.Context())
	t.Fatalf("the target's app did not get m1 in 10 s: consumer delivered %d, ack pending %d, waiting %d", info.Delivered.Stream, info.NumAckPending, info.NumWaiting)
}

// TestNATSClonedPullInboxAfterTheStop: a stop-and-copy target learns its
// cutoff before the restored app's first pull request, and has nothing to
// replay, so that first request switches the consumer at once. The switch
// put the held inbox back on the server at once too, ahead of the UNSUB
// the same request had queued, which then took it off for good: the app's
// later pull requests went to the server with no one to take the answer,
// and the e2e stop-and-copy consumer stopped at its cutoff (24 of 120).
// Every SUB and UNSUB of a held inbox now goes in the app's queue, in
// order. Each round is a fresh pair: the race is within one request.
func TestNATSClonedPullInboxAfterTheStop(t *testing.T) {
	for round := range 20 {
		t.Run(strconv.Itoa(round), func(t *testing.T) {
			ctx := t.Context()
			pair := newNATSPair(t, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second}, false)
			js, work, source, target := pair.js, pair.work, pair.source, pair.target
			const inbox = "_INBOX.restored.2" // the same on both sides
			pull := "$JS.API.CONSUMER.MSG.NEXT." + work + ".worker"
			// The source's app pulled (and got nothing): its stop names
			// the consumer.
			src, err := nats.Connect("nats://" + source.AMQPAddr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(src.Close)
			if _, err := src.SubscribeSync(inbox); err != nil {
				t.Fatal(err)
			}
			if err := src.PublishRequest(pull, inbox, []byte(`{"batch":1,"no_wait":true}`)); err != nil {
				t.Fatal(err)
			}
			if err := src.Flush(); err != nil {
				t.Fatal(err)
			}
			if _, err := (control.Client{URL: "http://" + source.ControlAddr(), Token: token}).Stop(ctx, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			dst, err := nats.Connect("nats://" + target.AMQPAddr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(dst.Close)
			got := make(chan *nats.Msg, 64)
			if _, err := dst.ChanSubscribe(inbox, got); err != nil {
				t.Fatal(err)
			}
			// The SUB and the first pull in one write, as a reconnecting
			// nats.go sends them.
			if err := dst.PublishRequest(pull, inbox, []byte(`{"batch":1,"expires":2000000000}`)); err != nil {
				t.Fatal(err)
			}
			if _, err := js.Publish(ctx, work+".in", []byte("m1")); err != nil {
				t.Fatal(err)
			}
			pullsM1(t, pair, dst, got, inbox)
		})
	}
}
