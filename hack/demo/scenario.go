package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/e2e/lab/journal"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// result is one migration as the table shows it.
type result struct {
	strategy contract.Strategy
	kind     lab.Kind // the consumer's controller
	nats     bool     // the NATS consumer, not the AMQP one
	report   migrate.Report
	want     lab.ProducerResult // what the producer sent
	got      lab.AppState       // the restored consumer's state at the end
	// gap is the processing gap, from the consumers' journals
	// (journal.ProcessingGap); gapErr says why there is none.
	gap    journal.Gap
	gapErr error
	err    error // the migration, or the demo around it, failed
}

// label is the row's first cell: the strategy, and the broker when it is
// not RabbitMQ.
func (r result) label() string {
	if r.nats {
		return string(r.strategy) + " (NATS)"
	}
	return string(r.strategy)
}

// producer is the sample producer (AMQP, a process) or the NATS one (in
// the demo's process).
type producer interface {
	Wait(context.Context) (lab.ProducerResult, error)
	Stop()
}

// ok reports whether the restored consumer processed exactly what the
// producer sent: every message once, in order, with no redelivery skipped
// (the consumers fold every delivery unless told otherwise, so the hash
// alone would show a duplicate; a skip is one too).
func (r result) ok() bool {
	return r.err == nil && r.want.Count > 0 && r.got.Count == r.want.Count && r.got.Hash == r.want.Hash && r.got.Skipped == 0
}

// How long the demo waits for the consumer to get going, and for the
// restored one to catch up once the producer is done.
const (
	warmupTimeout = 2 * time.Minute
	settleTimeout = time.Minute
)

// migrateOnce starts a consumer as a Deployment or a StatefulSet (m.kind)
// of one replica on node 1 with its own queue (for m.nats, its own
// JetStream stream and durable pull consumer), feeds it with the AMQP
// producer at bin (or the NATS one), moves its pod to node 2 by
// m.strategy once it has consumed for o.warmup, and compares its state at
// the end with what the producer sent. It deletes the workload, the queue
// or stream and the replay log afterwards, unless o.keep.
func migrateOnce(ctx context.Context, l *lab.Lab, o options, m migration, bin string, say func(string, ...any)) (res result) {
	s, kind := m.strategy, m.kind
	res.strategy, res.kind, res.nats = s, kind, m.nats
	tag := randomTag()
	name := "demo-" + string(s) + "-" + tag
	if m.nats {
		name = "demo-nats-" + string(s) + "-" + tag
	}
	sayf := func(format string, args ...any) { say("%s: "+format, append([]any{res.label()}, args...)...) }
	fail := func(err error) result {
		res.err = err
		if ctx.Err() != nil {
			sayf("interrupted: %v", err)
		} else {
			sayf("FAILED: %v", err)
		}
		return res
	}

	consumer := lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: int(o.work.Milliseconds()), Image: "consumer", ReadOnlyRoot: true}
	// The NATS consumer binds to a durable consumer of a stream, which is
	// made first; the AMQP one declares its queue itself.
	var stream *lab.NATSStream
	if m.nats {
		// As the NATS e2e tests run it: pull mode, a writable root.
		consumer.Image, consumer.NATSMode, consumer.ReadOnlyRoot = "consumer-nats", "pull", false
		var err error
		if stream, err = lab.CreateNATSStream(ctx, natsURL, name, consumer.NATSMode); err != nil {
			return fail(err)
		}
	}
	src, err := l.StartWorkload(ctx, kind, consumer)
	var logName string
	if src != nil {
		logName = inject.LogName(src)
	}
	var target *corev1.Pod
	defer func() {
		if o.keep {
			if target != nil {
				sayf("-keep: the restored consumer's state: curl http://%s:%d/state", target.Status.PodIP, lab.AppPort)
			}
			if m.nats {
				sayf("-keep: %s %s stays; stream %s and replay log %s stay on the NATS server (nats stream rm NAME removes each)", kind, name, name, shadowqueue.JetStreamName(logName))
			} else {
				sayf("-keep: %s %s stays; queue %s and replay log %s stay on the broker (rabbitmqctl delete_queue NAME removes each)", kind, name, name, logName)
			}
			return
		}
		// The cleanup runs when ctx has ended too: the broker outlives the
		// cluster.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		err := l.DeleteWorkload(cctx, kind, name)
		if m.nats {
			err = errors.Join(err, deleteNATSObjects(cctx, stream, logName))
		} else {
			err = errors.Join(err, deleteBrokerObjects(cctx, name, logName))
		}
		if err != nil {
			sayf("cleanup: %v", err)
		}
	}()
	if err != nil {
		return fail(fmt.Errorf("start the consumer %s %s on %s: %w", kind, name, cluster.NodeName(1), err))
	}
	what := "queue"
	if m.nats {
		what = "JetStream stream (durable pull consumer " + lab.NATSDurable + ")"
	}
	sayf("%s %s: pod %s running on %s (pod IP %s), injected by the webhook; %s %s, replay log %s", kind, name, src.Name, src.Spec.NodeName, src.Status.PodIP, what, name, logName)
	plan := migrate.Plan{
		Name: "demo-" + tag, Namespace: lab.Namespace, Pod: src.Name, Container: "app",
		// A StatefulSet's pod keeps its name; a ReplicaSet's gets this one.
		TargetNode: cluster.NodeName(2), TargetPod: src.Name + "-moved", Strategy: s,
	}

	var prod producer
	if m.nats {
		prod = stream.Produce(ctx, o.messages, o.rate)
	} else if prod, err = lab.StartProducer(bin, name, o.rate, o.messages); err != nil {
		return fail(fmt.Errorf("start the producer: %w", err))
	}
	defer prod.Stop()
	sayf("producer started: %d messages at %g msg/s", o.messages, o.rate)

	n := o.warmupMessages()
	if _, err := waitState(ctx, src, warmupTimeout, func(st lab.AppState) bool { return st.Count >= n }); err != nil {
		return fail(fmt.Errorf("the consumer in %s did not fold its first %d messages: %w", name, n, err))
	}
	sayf("the consumer has folded %d messages; migrating it to %s", n, plan.TargetNode)

	// Each consumer's journal is read as it stops for good, the target's
	// at the end: the processing gap is computed from them.
	journals := l.NewJournals(src, plan)
	began := time.Now()
	res.report, err = migrate.Run(ctx, l.Env(func(phase string, took time.Duration) {
		sayf("  %-20s %8v", phase, took.Round(time.Millisecond))
		journals.AfterPhase(ctx, phase)
	}), plan)
	ended := time.Now()
	if err != nil {
		return fail(err)
	}
	rep := res.report
	sayf("migrated in %v: switch %v (the source's stop to the target's consume), checkpoint ID %d, cutoff %d", rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), rep.Start, rep.CutoffID)

	target, err = l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, rep.TargetPod, metav1.GetOptions{})
	if err != nil {
		return fail(fmt.Errorf("the target pod %s: %w", rep.TargetPod, err))
	}
	if target.Spec.NodeName != plan.TargetNode {
		return fail(fmt.Errorf("the target pod %s runs on %s, not on %s", rep.TargetPod, target.Spec.NodeName, plan.TargetNode))
	}
	if c := metav1.GetControllerOf(target); c == nil || c.UID != metav1.GetControllerOf(src).UID {
		return fail(fmt.Errorf("the target pod %s is controlled by %v, not by the source's %s", rep.TargetPod, c, metav1.GetControllerOf(src).Name))
	}
	sayf("pod %s runs on %s, owned by %s %s again", target.Name, target.Spec.NodeName, metav1.GetControllerOf(target).Kind, metav1.GetControllerOf(target).Name)
	if res.want, err = prod.Wait(ctx); err != nil {
		return fail(err)
	}
	sayf("producer done: %d messages, hash %s; waiting for the restored consumer on %s", res.want.Count, short(res.want.Hash), target.Spec.NodeName)
	want := fmt.Sprintf("msg-%d", res.want.Count)
	res.got, err = waitState(ctx, target, settleTimeout, func(st lab.AppState) bool { return st.Count >= res.want.Count && st.Last == want })
	if err != nil && ctx.Err() != nil {
		return fail(err)
	}
	journals.Target(target)
	if res.gap, res.gapErr = journals.Gap(began, ended); res.gapErr != nil {
		sayf("no processing gap: %v", res.gapErr)
	} else {
		sayf("processing gap %v: from %s to %s no consumer finished a message while one waited",
			res.gap.Duration().Round(time.Millisecond), res.gap.Start.Format("15:04:05.000"), res.gap.End.Format("15:04:05.000"))
	}
	verdict := "OK: every message processed once, in order, across the migration"
	if !res.ok() {
		lost, dup := tallyOf(res.want, res.got).cells()
		verdict = fmt.Sprintf("MISMATCH: %s lost, %s duplicated, %d redeliveries skipped", lost, dup, res.got.Skipped)
	}
	sayf("restored consumer: %d messages, hash %s (reconnects %d, skipped redeliveries %d): %s",
		res.got.Count, short(res.got.Hash), res.got.Reconnects, res.got.Skipped, verdict)
	return res
}

// waitState polls the consumer in pod until done holds for its state, and
// returns the last state it read. It fails when timeout passes or ctx ends.
func waitState(ctx context.Context, pod *corev1.Pod, timeout time.Duration, done func(lab.AppState) bool) (lab.AppState, error) {
	var last lab.AppState
	var lastErr error
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := lab.GetAppState(pod)
		if err == nil {
			last = st
			if done(st) {
				return st, nil
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-deadline.C:
			if lastErr != nil {
				return last, fmt.Errorf("not after %v (GET /state: %w)", timeout, lastErr)
			}
			return last, fmt.Errorf("not after %v (it has %d messages, the last %q)", timeout, last.Count, last.Last)
		case <-tick.C:
		}
	}
}

// randomTag tells one run's pods, queues and checkpoint images from an
// earlier run's leftovers.
func randomTag() string {
	b := make([]byte, 3)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// short is a hash as the demo prints it: its first 16 hex digits.
func short(h string) string {
	if len(h) > 16 {
		return h[:16]
	}
	return h
}
