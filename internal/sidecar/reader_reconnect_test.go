package sidecar_test

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// killStreamConnections ends, on the broker, every stream connection named
// name (its client-provided name), as a broker restart or an operator's
// close_connection would, and returns how many. The broker is shared: it
// touches no other connection.
func killStreamConnections(t *testing.T, name string) int {
	t.Helper()
	return killNamedConnections(t, "rabbit_stream:list(<<\"/\">>)", "rabbit_stream_reader", name)
}

// killNamedConnections kills, on the broker, the connection processes that
// list (an Erlang expression) gives whose client-provided name is name, as
// reader (their module) reports it, and returns how many.
func killNamedConnections(t *testing.T, list, reader, name string) int {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		testenv.Missing(t, "rabbitmqctl", "run the tests on the machine that runs RabbitMQ (hack/setup.sh)")
	}
	expr := fmt.Sprintf(`Named = fun(P) -> case catch %s:info(P, [client_properties]) of `+
		`[{client_properties, Props}] -> lists:member({<<"connection_name">>, longstr, <<"%s">>}, Props); _ -> false end end, `+
		`length([exit(P, kill) || P <- %s, Named(P)]).`, reader, name, list)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out []byte
	var err error
	for attempt := 1; attempt <= 5; attempt++ { // the listing races with other tests' connections
		if out, err = exec.CommandContext(ctx, "rabbitmqctl", "-q", "eval", expr).CombinedOutput(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("rabbitmqctl eval (kill the connections named %s): %v: %s", name, err, out)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("rabbitmqctl eval: %q: %v", out, err)
	}
	return n
}

type sourceStatus struct {
	Source struct {
		LogLast    uint64 `json:"logLastId"`
		Reader     string `json:"reader"`
		Reconnects uint64 `json:"reconnects"`
		Error      string `json:"error"`
	} `json:"source"`
}

// TestTargetReaderReconnects (issue 21): a target follows the log while the
// source still serves; the broker closes the target's log reader; the
// target says so, reconnects, and after the source's stop its app ends with
// the producer's hash: nothing of the log was missed or doubled.
func TestTargetReaderReconnects(t *testing.T) {
	const n = 600
	e := newEnv(t)
	q := e.queue()
	source := e.start(sidecar.Options{})
	src := &env{t: t, broker: e.broker, log: e.log, sc: source}
	srcApp, _ := goConsumer(t, source, q, 10)
	want := produce(t, e, q, n, "0")
	testenv.Eventually(t, 30*time.Second, "the source to process a part", func() bool {
		s, _ := appStateAt(srcApp)
		return s.Count >= n/5
	})

	readerName := testenv.UniqueName("ms2m-test-target-reader")
	target := e.startConfig(targetConfig(e), sidecar.Options{ReaderName: readerName})
	tgt := &env{t: t, broker: e.broker, log: e.log, sc: target}
	var st sourceStatus
	testenv.Eventually(t, 30*time.Second, "the target's reader to follow the log", func() bool {
		tgt.call("GET", "/state", &st)
		return st.Source.Reader == "following" && st.Source.LogLast > 0
	})
	if k := killStreamConnections(t, readerName); k < 1 {
		t.Fatalf("the broker has no stream connection named %s", readerName)
	}
	testenv.Eventually(t, 30*time.Second, "the target's reader to reconnect", func() bool {
		tgt.call("GET", "/state", &st)
		return st.Source.Reconnects >= 1 && st.Source.Reader == "following"
	})
	if code := src.call("POST", "/stop?timeout=20s", nil); code != 200 {
		t.Fatalf("stop = %d", code)
	}
	addr := testenv.FreeAddr(t)
	runApp(t, exec.Command(testenv.Build(t, "examples/consumer")), map[string]string{
		"AMQP_URL": "amqp://guest:guest@" + target.AMQPAddr() + "/",
		"QUEUE":    q, "PREFETCH": "10", "WORK_MS": "0", "HTTP_ADDR": addr, "DECLARE": "false",
	})
	var got appState
	testenv.Eventually(t, 60*time.Second, "the target's app to process everything", func() bool {
		got, _ = appStateAt(addr)
		return got.Count >= n
	})
	if got.Count != n || got.Hash != want {
		tgt.call("GET", "/state", &st)
		t.Fatalf("target app: %+v, want %d messages and the producer's hash %s (target source %+v)", got, n, want, st.Source)
	}
}
