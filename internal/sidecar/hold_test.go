package sidecar_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
)

// TestResumeHoldAfterRestart: a sidecar restarted between a quiesce and
// the checkpoint comes back serving and hands the app deliveries after the
// quiesce's checkpoint ID. The migrator's resume with the quiesce's hold
// then gets 409, so that it discards the checkpoint; before holds, the
// resume answered OK and the checkpoint was used.
func TestResumeHoldAfterRestart(t *testing.T) {
	e := newEnv(t)
	sc := e.start(sidecar.Options{})
	q := e.queue()
	// Five, the app's whole window: once it acked them the broker has
	// nothing to send before the quiesce, which would otherwise wait for
	// the app to ack a window refilled meanwhile (it never does here).
	e.publish(q, bodies("h", 5)...)
	ctx := t.Context()
	client := func(sc *sidecar.Sidecar) control.Client {
		return control.Client{URL: "http://" + sc.ControlAddr(), Token: token}
	}

	conn := e.dial(amqp.Config{})
	ch, _ := conn.Channel()
	if err := ch.Qos(5, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	ds, _ := ch.Consume(q, "", false, false, false, false, nil)
	for range 5 {
		recv(t, ds).Ack(false)
	}
	cut, err := client(sc).Quiesce(ctx, 10*time.Second)
	if err != nil || cut.Hold == "" || cut.ID < 5 {
		t.Fatalf("quiesce = %+v, %v; want a cut at 5 or later, with a hold", cut, err)
	}
	if st, err := client(sc).State(ctx); err != nil || st.Hold != cut.Hold || st.Mode != control.ModeQuiesced {
		t.Fatalf("state: mode %s, hold %q (%v); want quiesced under %q", st.Mode, st.Hold, err, cut.Hold)
	}
	e.publish(q, bodies("h2", 15)...) // after the checkpoint ID

	// The restart: the sidecar goes away and comes back on the same log.
	conn.Close()
	sc.Close()
	sc = e.start(sidecar.Options{})
	conn = e.dial(amqp.Config{})
	ch, _ = conn.Channel()
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	ds, _ = ch.Consume(q, "", false, false, false, false, nil)
	recv(t, ds).Ack(false)
	if last := e.state().Log.LastID; last <= cut.ID {
		t.Fatalf("the restarted sidecar's last delivery ID is %d, want one after the checkpoint ID %d", last, cut.ID)
	}

	err = client(sc).ResumeHold(ctx, cut.Hold)
	if !errors.Is(err, control.ErrConflict) || !strings.Contains(err.Error(), "409 Conflict") ||
		!strings.Contains(err.Error(), "holds no quiesce, not hold "+cut.Hold) || !strings.Contains(err.Error(), "discard it") {
		t.Fatalf("resume under the hold of the quiesce before the restart = %v, want 409 that says the sidecar holds no quiesce and to discard the checkpoint", err)
	}
	if st := e.state(); st.Mode != "serving" {
		t.Errorf("after the refused resume: mode %s, want serving", st.Mode)
	}

	// The restarted sidecar's own quiesce and resume under its hold work
	// (with no app, which need not settle anything first).
	conn.Close()
	cut2, err := client(sc).Quiesce(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := client(sc).ResumeHold(ctx, cut2.Hold); err != nil {
		t.Fatalf("resume under the hold in force: %v", err)
	}
	// And a resume with a hold on the serving sidecar is 409, one without
	// is OK, as before holds.
	if err := client(sc).ResumeHold(ctx, cut2.Hold); !errors.Is(err, control.ErrConflict) {
		t.Errorf("resume with a hold on a serving sidecar = %v, want 409", err)
	}
	if err := client(sc).Resume(ctx); err != nil {
		t.Errorf("resume without a hold on a serving sidecar = %v, want OK", err)
	}
}
