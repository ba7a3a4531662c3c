package sidecar_test

import (
	"os/exec"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// killAMQPConnections ends, on the broker, every AMQP connection named
// name (its client-provided name) as a crash of its connection process
// would: the socket closes without a connection.close. It returns how
// many. The broker is shared: it touches no other connection.
func killAMQPConnections(t *testing.T, name string) int {
	t.Helper()
	return killNamedConnections(t, "rabbit_networking:connections()", "rabbit_reader", name)
}

// TestBrokerLossWhileTheAppHoldsADelivery (issue 21): the broker's end of
// the app's connection dies while the app works on a delivery (400 ms a
// message, prefetch 1). The sidecar keeps the app's connection until the
// app acked it, the app reconnects, and the broker's redelivery of that
// message is absorbed: the app folds each message once, the producer's
// hash. Before the drain, the app's ack failed with its connection and it
// folded the redelivery too (one more than sent).
func TestBrokerLossWhileTheAppHoldsADelivery(t *testing.T) {
	cutWhileTheAppHoldsADelivery(t, "ms2m-test-brokerloss", func(name string) func() {
		return func() {
			if k := killAMQPConnections(t, name); k != 1 {
				t.Fatalf("killed %d broker connections named %s, want 1", k, name)
			}
		}
	})
}

// cutWhileTheAppHoldsADelivery runs the example consumer (400 ms a
// message, prefetch 1, its connection named from prefix) through a
// sidecar on 12 messages, calls the cut that arm(the name) returned 150 ms
// into its work on one, and fails unless the app folded each message
// once (the producer's hash) and reconnected.
func cutWhileTheAppHoldsADelivery(t *testing.T, prefix string, arm func(name string) func()) {
	const n = 12
	e := newEnv(t)
	q := e.queue()
	sc := e.start(sidecar.Options{})
	name := testenv.UniqueName(prefix)
	app := testenv.FreeAddr(t)
	runApp(t, exec.Command(testenv.Build(t, "examples/consumer")), map[string]string{
		"AMQP_URL": "amqp://guest:guest@" + sc.AMQPAddr() + "/", "QUEUE": q, "PREFETCH": "1", "WORK_MS": "400",
		"HTTP_ADDR": app, "DECLARE": "false", "CONNECTION_NAME": name,
	})
	cut := arm(name)
	want := produce(t, e, q, n, "0")
	var folded int
	testenv.Eventually(t, 30*time.Second, "the app to fold a few", func() bool {
		s, _ := appStateAt(app)
		folded = s.Count
		return folded >= 3
	})
	// Right after a fold the app acks and takes the next message: cut
	// 150 ms into its 400 ms of work on it.
	testenv.Eventually(t, 10*time.Second, "the app to fold the next", func() bool {
		s, _ := appStateAt(app)
		return s.Count > folded
	})
	time.Sleep(150 * time.Millisecond)
	cut()
	var got appState
	testenv.Eventually(t, 60*time.Second, "the app to fold every message", func() bool {
		got, _ = appStateAt(app)
		return got.Count >= n
	})
	time.Sleep(time.Second) // a doubled message would show as one more
	got, _ = appStateAt(app)
	if got.Count != n || got.Hash != want || got.Reconnects == 0 {
		t.Fatalf("the app: %+v, want %d messages, the producer's hash %s, and a reconnect", got, n, want)
	}
}
