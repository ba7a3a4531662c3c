package sidecar_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSReplayWritesBeforeItWaits: a target writes a run of replayed
// messages to the app in one write, but never holds them while it waits.
// The app's pull request asks for more than the log holds yet (the cutoff
// is not known before the source's stop): the records the target has must
// reach the app while the request is still open, not at its expiry. Fails
// when the target keeps its buffer over the wait for the next record.
func TestNATSReplayWritesBeforeItWaits(t *testing.T) {
	const count = 20
	nt := testenv.RequireNATS(t)
	ctx := t.Context()
	logName := testenv.UniqueName("ms2m-test-natslog")
	work := testenv.UniqueName("ms2m-test-natswork")
	js := natsAdmin(t, nt, work, logName)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: work, Subjects: []string{work + ".in"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, work, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	source, err := sidecar.Start(ctx, natsConfig(nt, logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = source.Close() })
	cfg := natsConfig(nt, logName, "127.0.0.1:0")
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
	target, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })

	for i := range count {
		if _, err := js.Publish(ctx, work+".in", fmt.Appendf(nil, "job-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	src, err := nats.Connect("nats://" + source.AMQPAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	sjs, err := jetstream.New(src)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := sjs.Consumer(ctx, work, "worker")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(count, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	handled := 0
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		handled++
	}
	if handled != count {
		t.Fatalf("the source's app handled %d messages, want %d (%v)", handled, count, batch.Error())
	}

	// The target's app asks for more than the log holds, with a long expiry.
	app, err := nats.Connect("nats://" + target.AMQPAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)
	inbox := nats.NewInbox()
	sub, err := app.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	req := fmt.Appendf(nil, `{"batch":%d,"expires":%d}`, 10*count, (60 * time.Second).Nanoseconds())
	if err := app.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+work+".worker", inbox, req); err != nil {
		t.Fatal(err)
	}
	for i := range count {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("the app got %d of the %d records the target has, while its pull request waits for more: %v", i, count, err)
		}
		if want := fmt.Sprintf("job-%d", i); string(m.Data) != want {
			t.Fatalf("replayed message %d is %q (status %q), want %q", i, m.Data, m.Header.Get("Status"), want)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	// The stop writes the cutoff: the replay ends and the consumer switches.
	if _, err := (control.Client{URL: "http://" + source.ControlAddr(), Token: token, HTTP: http.DefaultClient}).Stop(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	dst := control.Client{URL: "http://" + target.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	if _, err := dst.WaitSwitched(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil || m.Header.Get("Status") != "408" {
		t.Fatalf("after the switch the open pull request ended with %v, %v; want a 408", m, err)
	}
}
