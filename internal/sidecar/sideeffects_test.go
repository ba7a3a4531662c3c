package sidecar_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// publishingApp consumes q and publishes one result per message to out,
// waiting for the broker's confirm before it acks when confirms is set. It
// records the confirm tags it got.
type publishingApp struct {
	mu       sync.Mutex
	handled  int
	confirms []uint64
	nacks    int
}

func startPublishingApp(t *testing.T, addr, q, out string, confirms bool) *publishingApp {
	return startResultApp(t, addr, q, out, confirms, func(body []byte) []byte { return append([]byte("result-"), body...) })
}

// startResultApp is startPublishingApp with the result made by result.
func startResultApp(t *testing.T, addr, q, out string, confirms bool, result func(body []byte) []byte) *publishingApp {
	t.Helper()
	a := &publishingApp{}
	conn, err := amqp.Dial("amqp://guest:guest@" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var acks chan amqp.Confirmation
	if confirms {
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		acks = ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	ds, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range ds {
			time.Sleep(2 * time.Millisecond)
			if err := ch.Publish("", out, false, false, amqp.Publishing{Body: result(d.Body)}); err != nil {
				return
			}
			if confirms {
				c, ok := <-acks
				if !ok {
					return
				}
				a.mu.Lock()
				a.confirms = append(a.confirms, c.DeliveryTag)
				if !c.Ack {
					a.nacks++
				}
				a.mu.Unlock()
			}
			a.mu.Lock()
			a.handled++
			a.mu.Unlock()
			d.Ack(false)
		}
	}()
	return a
}

// TestReplayHasNoSideEffects: an app that publishes one result per message
// goes through a handoff; downstream, every result arrives exactly once and
// in order, and the target app's confirms run without a gap.
func TestReplayHasNoSideEffects(t *testing.T) {
	const n = 150
	for _, confirms := range []bool{false, true} {
		t.Run(fmt.Sprintf("confirms=%v", confirms), func(t *testing.T) {
			e := newEnv(t)
			q, out := e.queue(), e.queue()
			source := e.start(sidecar.Options{})
			target := e.startConfig(targetConfig(e), sidecar.Options{})
			startPublishingApp(t, source.AMQPAddr(), q, out, confirms)
			dst := startPublishingApp(t, target.AMQPAddr(), q, out, confirms)

			var mu sync.Mutex
			var results []string
			down, err := e.direct().Consume(out, "", true, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				for d := range down {
					mu.Lock()
					results = append(results, string(d.Body))
					mu.Unlock()
				}
			}()

			var producers sync.WaitGroup
			publishPaced(t, e, q, n, 150, &producers)
			time.Sleep(400 * time.Millisecond)
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			tm, err := control.Handover(ctx,
				control.Client{URL: "http://" + source.ControlAddr(), Token: token},
				control.Client{URL: "http://" + target.ControlAddr(), Token: token},
				control.HandoverOptions{MaxLag: 1000})
			if err != nil {
				t.Fatal(err)
			}
			producers.Wait()
			testenv.Eventually(t, 30*time.Second, "every result downstream", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(results) >= n
			})
			time.Sleep(300 * time.Millisecond) // a duplicate would show up by now
			want := make([]string, n)
			for i := range want {
				want[i] = fmt.Sprintf("result-%s-%d", q, i+1)
			}
			mu.Lock()
			if d := cmp.Diff(want, results); d != "" {
				t.Errorf("results downstream (-want +got):\n%s", d)
			}
			mu.Unlock()

			// The target replayed what the source had handled: it absorbed
			// exactly those publishes.
			var st struct {
				Replay struct {
					Suppressed []struct {
						RoutingKey string `json:"routingKey"`
						Count      uint64 `json:"count"`
					} `json:"suppressed"`
				} `json:"replay"`
			}
			dstEnv := &env{t: t, broker: e.broker, log: e.log, sc: target}
			dstEnv.call("GET", "/state", &st)
			if s := st.Replay.Suppressed; len(s) != 1 || s[0].RoutingKey != out || s[0].Count != tm.CutoffID {
				t.Errorf("suppressed publishes = %+v, want %d to %s (the cutoff)", s, tm.CutoffID, out)
			}
			if confirms {
				dst.mu.Lock()
				defer dst.mu.Unlock()
				for i, tag := range dst.confirms {
					if tag != uint64(i+1) {
						t.Fatalf("target app's confirm %d has tag %d: want one gap-free sequence (%v)", i+1, tag, dst.confirms)
					}
				}
				if len(dst.confirms) != n || dst.nacks != 0 {
					t.Errorf("target app got %d confirms (%d nacks), want %d acks", len(dst.confirms), dst.nacks, n)
				}
			}
		})
	}
}

// TestPublishCheck: with MS2M_PUBLISH_CHECK on, a target compares what the
// app publishes while it handles replayed messages against what the source
// published for them. A deterministic app passes; one whose results differ
// between source and target is reported.
func TestPublishCheck(t *testing.T) {
	for name, deterministic := range map[string]bool{"deterministic": true, "non-deterministic": false} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			q, out := e.queue(), e.queue()
			cfg := e.config()
			cfg.PublishCheck = true
			source := e.startConfig(cfg, sidecar.Options{})
			tcfg := targetConfig(e)
			tcfg.PublishCheck = true
			target := e.startConfig(tcfg, sidecar.Options{})
			result := func(instance string) func([]byte) []byte {
				return func(body []byte) []byte {
					r := append([]byte("result-"), body...)
					if !deterministic && body[len(body)-1]%2 == 1 {
						r = append(r, instance...) // odd messages: depends on which process handles them
					}
					return r
				}
			}
			startResultApp(t, source.AMQPAddr(), q, out, true, result("-on-source"))
			startResultApp(t, target.AMQPAddr(), q, out, true, result("-on-target"))

			var producers sync.WaitGroup
			publishPaced(t, e, q, 80, 200, &producers)
			time.Sleep(300 * time.Millisecond)
			tm := handover(t, source, target, control.HandoverOptions{MaxLag: 1000})
			producers.Wait()
			if tm.CutoffID == 0 {
				t.Fatal("the source handled nothing before the stop; the check has nothing to compare")
			}

			type check struct {
				Checked    uint64 `json:"checked"`
				Mismatched uint64 `json:"mismatched"`
				Pending    int    `json:"pending"`
				Mismatches []struct {
					ID     uint64 `json:"id"`
					Source []struct {
						RoutingKey string `json:"routingKey"`
						BodySHA256 string `json:"bodySha256"`
					} `json:"source"`
					Target []struct {
						RoutingKey string `json:"routingKey"`
						BodySHA256 string `json:"bodySha256"`
					} `json:"target"`
				} `json:"mismatches"`
			}
			var st struct {
				Replay struct {
					PublishCheck *check `json:"publishCheck"`
				} `json:"replay"`
			}
			dst := &env{t: t, broker: e.broker, log: e.log, sc: target}
			testenv.Eventually(t, 20*time.Second, "every replayed message checked", func() bool {
				dst.call("GET", "/state", &st)
				c := st.Replay.PublishCheck
				return c != nil && c.Checked == tm.CutoffID && c.Pending == 0
			})
			c := st.Replay.PublishCheck
			// Messages 1..cutoff were replayed; the odd ones differ.
			wantMismatched := uint64(0)
			if !deterministic {
				wantMismatched = (tm.CutoffID + 1) / 2
			}
			if c.Mismatched != wantMismatched {
				t.Fatalf("publish check = %+v, want %d of %d mismatched", c, wantMismatched, tm.CutoffID)
			}
			if !deterministic {
				m := c.Mismatches[0]
				if m.ID%2 != 1 || len(m.Source) != 1 || len(m.Target) != 1 || m.Source[0].RoutingKey != out ||
					m.Target[0].RoutingKey != out || m.Source[0].BodySHA256 == m.Target[0].BodySHA256 {
					t.Errorf("first mismatch = %+v, want an odd delivery with one publish to %s on each side, bodies differing", m, out)
				}
			}
			if got := metricValue(t, "http://"+target.ControlAddr(), "ms2m_sidecar_publish_mismatches_total"); got != float64(wantMismatched) {
				t.Errorf("ms2m_sidecar_publish_mismatches_total = %v, want %d", got, wantMismatched)
			}
		})
	}
}
