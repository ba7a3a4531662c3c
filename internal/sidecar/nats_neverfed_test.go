package sidecar_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSHandoffNeverFed: a NATS consumer that has had no delivery since
// its log was made (a new app on an empty stream) can be handed over, push
// and pull. The log holds only the stop's cutoff marker, which names the
// app's consumers; before, the target refused the consumer as one that
// "never appears in the replay log" and the migration rolled back.
func TestNATSHandoffNeverFed(t *testing.T) {
	for _, mode := range []string{"push", "pull"} {
		t.Run(mode, func(t *testing.T) { natsNeverFed(t, mode) })
	}
}

func natsNeverFed(t *testing.T, mode string) {
	const n = 30
	ctx := t.Context()
	pair := newNATSPair(t, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxAckPending: 50}, mode == "push")
	js, work, cons, source, target := pair.js, pair.work, pair.cons, pair.source, pair.target
	startApp := func(sc *sidecar.Sidecar) string {
		addr := testenv.FreeAddr(t)
		argv := testenv.NATSConsumer(t, "go")
		runApp(t, exec.Command(argv[0], argv[1:]...), map[string]string{
			"NATS_URL": "nats://" + sc.AMQPAddr(), "STREAM": work, "CONSUMER": "worker", "MODE": mode,
			"PREFETCH": "10", "WORK_MS": "1", "HTTP_ADDR": addr,
		})
		return addr
	}
	srcApp := startApp(source)
	testenv.Eventually(t, 30*time.Second, "the source's app to subscribe or pull", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && (info.PushBound || info.NumWaiting > 0)
	})
	dstApp := startApp(target)
	hctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	stop, err := control.Handover(hctx,
		control.Client{URL: "http://" + source.ControlAddr(), Token: token},
		control.Client{URL: "http://" + target.ControlAddr(), Token: token},
		control.HandoverOptions{MaxLag: 5})
	if err != nil {
		t.Fatalf("handover: %v", err)
	}
	if stop.CutoffID != 0 {
		t.Fatalf("handover: cutoff %d, want 0", stop.CutoffID)
	}
	var h natsChain
	h.publish(t, ctx, js, work+".in", 0, n)
	var got appState
	testenv.Eventually(t, 60*time.Second, "the target to process every message", func() bool {
		got, _ = appStateAt(dstApp)
		return got.Count >= n
	})
	if want := h.hex(); got.Count != n || got.Hash != want {
		t.Fatalf("target app %+v, want count %d and the producer's hash %s", got, n, want)
	}
	if s, _ := appStateAt(srcApp); s.Count != 0 {
		t.Errorf("source app processed %d, want 0", s.Count)
	}
}
