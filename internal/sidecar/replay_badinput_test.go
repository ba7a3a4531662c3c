package sidecar_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// writeLog writes delivery records with the given IDs on queue to e's log.
func (e *env) writeLog(queue string, ids ...uint64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 20*time.Second)
	defer cancel()
	l, err := shadowqueue.OpenStream(ctx, shadowqueue.StreamOptions{URI: e.broker.StreamURI, Name: e.log})
	if err != nil {
		e.t.Fatal(err)
	}
	defer l.Close()
	var recs []shadowqueue.Record
	for _, id := range ids {
		recs = append(recs, shadowqueue.Record{Kind: shadowqueue.KindDelivery, ID: id, Queue: queue, Body: []byte("m"), Time: time.Now()})
	}
	if err := l.Write(ctx, recs); err != nil {
		e.t.Fatal(err)
	}
}

type targetState struct {
	Source *struct {
		Error string `json:"error"`
	} `json:"source"`
	Replay *struct {
		Error string `json:"error"`
	} `json:"replay"`
}

// consumers returns how many consumers the broker has on queue.
func (e *env) consumers(queue string) int {
	e.t.Helper()
	q, err := e.direct().QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return q.Consumers
}

// TestReplayBadInput: a target with a range the log cannot serve says so
// and consumes nothing upstream.
func TestReplayBadInput(t *testing.T) {
	t.Run("missing log", func(t *testing.T) {
		e := newEnv(t)
		cfg := e.config()
		cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		_, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
		if err == nil || !strings.Contains(err.Error(), "does not exist") {
			t.Fatalf("start with a missing log = %v, want an error saying it does not exist", err)
		}
	})

	for name, tc := range map[string]struct {
		logIDs    []uint64
		logQueue  string
		start     string
		cutoff    string
		appQueue  string // "" = the log's queue
		wantError string
		where     func(targetState) string
	}{
		"start older than retention": {
			logIDs: []uint64{100, 101, 102}, start: "5", cutoff: "102",
			wantError: "no longer holds", where: func(s targetState) string { return s.Source.Error },
		},
		"queue not in the log": {
			logIDs: []uint64{1, 2, 3}, start: "0", cutoff: "3", appQueue: "other",
			wantError: "never appears", where: func(s targetState) string { return s.Replay.Error },
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			q := e.queue()
			appQ := q
			if tc.appQueue != "" {
				appQ = e.queue()
			}
			e.writeLog(q, tc.logIDs...)
			cfg := e.config()
			cfg.ReplayStart, cfg.ReplayCutoff = tc.start, tc.cutoff
			e.startConfig(cfg, sidecar.Options{})
			ch, err := e.dial(amqp.Config{}).Channel()
			if err != nil {
				t.Fatal(err)
			}
			ds, err := ch.Consume(appQ, "", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			var st targetState
			testenv.Eventually(t, 10*time.Second, "the error in /state", func() bool {
				st = targetState{}
				e.call("GET", "/state", &st)
				return st.Source != nil && st.Replay != nil && strings.Contains(tc.where(st), tc.wantError)
			})
			noDelivery(t, ds, 300*time.Millisecond, "replay failed")
			if n := e.consumers(appQ); n != 0 {
				t.Errorf("the broker has %d consumers on %s, want 0: a failed replay must consume nothing upstream", n, appQ)
			}
		})
	}
}

// TestTargetStateShowsReplay: a target's /state says it is replaying, where
// it is, the cutoff once known, and its lag.
func TestTargetStateShowsReplay(t *testing.T) {
	e := newEnv(t)
	q := e.queue()
	e.writeLog(q, 1, 2, 3)
	cfg := e.config()
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "3"
	e.startConfig(cfg, sidecar.Options{})
	var st struct {
		Mode      string  `json:"mode"`
		ReplayLag *uint64 `json:"replayLag"`
		Source    struct {
			Cutoff   uint64 `json:"cutoffId"`
			Complete bool   `json:"complete"`
			LogLast  uint64 `json:"logLastId"`
		} `json:"source"`
	}
	testenv.Eventually(t, 10*time.Second, "the target to read the log", func() bool {
		e.call("GET", "/state", &st)
		return st.Source.Complete
	})
	if st.Mode != "replaying" || st.ReplayLag == nil || *st.ReplayLag != 3 || st.Source.Cutoff != 3 || st.Source.LogLast != 3 {
		t.Fatalf("target state before its app consumed = %+v (lag %v), want replaying, lag 3, cutoff 3", st, st.ReplayLag)
	}
	ch, _ := e.dial(amqp.Config{}).Channel()
	ds, _ := ch.Consume(q, "", false, false, false, false, nil)
	for range 3 {
		recv(t, ds).Ack(false)
	}
	testenv.Eventually(t, 10*time.Second, "the target to switch", func() bool {
		e.call("GET", "/state", &st)
		return st.Mode == "serving" && st.ReplayLag != nil && *st.ReplayLag == 0
	})
}
