package sidecar_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestStopSurvivesARestart: a sidecar that the kubelet restarts after its
// stop (between a migration's stop and its end) starts stopped, at the
// same cutoff: the app's consumer, reconnected, gets nothing while the
// broker holds its messages ready, until POST /resume; the recorded stop
// is gone then. Before MS2M_STATE_DIR the restarted sidecar served again,
// and what it took after the cutoff never reached the target
// (docs/faults.md).
func TestStopSurvivesARestart(t *testing.T) {
	e := newEnv(t)
	q := e.queue()
	cfg := e.config()
	first := e.startConfig(cfg, sidecar.Options{})
	msgs := consumeThrough(t, e, q)
	e.publish(q, "a", "b")
	for range 2 {
		if err := recv(t, msgs).Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	var stopped struct {
		CutoffID uint64 `json:"cutoffId"`
		Epoch    uint64 `json:"epoch"`
	}
	if code := e.call("POST", "/stop", &stopped); code != 200 {
		t.Fatalf("POST /stop = %d", code)
	}
	first.Close()

	e.startConfig(cfg, sidecar.Options{})
	if st := e.state(); st.Mode != "stopped" || st.CutoffID != stopped.CutoffID {
		t.Fatalf("the restarted sidecar is %s at cutoff %d, want stopped at %d", st.Mode, st.CutoffID, stopped.CutoffID)
	}
	msgs = consumeThrough(t, e, q)
	e.publish(q, "c", "d")
	direct := e.direct()
	testenv.Eventually(t, 10*time.Second, "the broker to hold c and d ready", func() bool {
		qi, err := direct.QueueDeclarePassive(q, false, false, false, false, nil)
		return err == nil && qi.Messages == 2
	})
	noDelivery(t, msgs, 500*time.Millisecond, "the restarted sidecar is stopped")
	if code := e.call("POST", "/stop", &stopped); code != 200 || stopped.CutoffID != e.state().CutoffID {
		t.Errorf("POST /stop on the restarted sidecar = %d, cutoff %d: want its recorded stop again", code, stopped.CutoffID)
	}

	if code := e.call("POST", "/resume", nil); code != 200 {
		t.Fatalf("POST /resume = %d", code)
	}
	for _, want := range []string{"c", "d"} {
		d := recv(t, msgs)
		if string(d.Body) != want {
			t.Errorf("after the resume: %q, want %q", d.Body, want)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "stopped.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the recorded stop is still there after the resume: %v", err)
	}
}

// TestRecordedStopOfAnotherLogIsRefused: a state folder whose recorded
// stop names another replay log (MS2M_LOG_NAME changed under a stopped
// pod) stops the sidecar from starting, saying so, rather than serving.
func TestRecordedStopOfAnotherLogIsRefused(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "stopped.json"), []byte(`{"logName":"someone-else","cutoffId":7,"epoch":2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	sc, err := sidecar.Start(t.Context(), cfg, sidecar.Options{Logger: testLogger()})
	if err == nil {
		sc.Close()
		t.Fatal("the sidecar started on another log's recorded stop")
	}
	if !strings.Contains(err.Error(), `is of log "someone-else"`) {
		t.Errorf("err = %v, want the other log named", err)
	}
}

// consumeThrough opens a channel to the current sidecar and consumes q on
// it, with manual acks.
func consumeThrough(t *testing.T, e *env, q string) <-chan amqp.Delivery {
	t.Helper()
	ch, err := e.dial(amqp.Config{}).Channel()
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}
