package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestSourceSidecarKilledAfterTheStop is the fault matrix's "source's
// sidecar restarted right after its stop" on real nodes: the source's
// sidecar is SIGKILLed as soon as its /stop has answered, and the
// migration goes on only once the kubelet has restarted it. The restarted
// sidecar finds its stop in its state folder (MS2M_STATE_DIR, the pod's
// emptyDir) and starts stopped, so that nothing after the cutoff reaches
// the source's app, which the migration then deletes: the target's count
// and hash are the producer's. Before the state folder it served again,
// and what it took while the producer went on was lost.
func TestSourceSidecarKilledAfterTheStop(t *testing.T) {
	l := needLab(t, "it kills a container through its node's containerd")
	for _, s := range []contract.Strategy{contract.StrategyMS2M, contract.StrategyStopAndCopy} {
		t.Run(string(s), func(t *testing.T) { sidecarKilledAfterStop(t, l, s) })
	}
}

func sidecarKilledAfterStop(t *testing.T, l *lab.Lab, strategy contract.Strategy) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	name := testenv.UniqueName("sckill")
	pod, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name, name+"-target") })
	prod := produce(t, pod, name, 10, 120, 10)

	env := l.Env(nil)
	base := http.DefaultTransport
	if env.HTTP != nil && env.HTTP.Transport != nil {
		base = env.HTTP.Transport
	}
	k := &killAfterStop{base: base, host: pod.Status.PodIP, kill: func(ctx context.Context) error {
		return restartSidecar(ctx, l, pod)
	}}
	env.HTTP = &http.Client{Transport: k, Timeout: 2 * time.Minute}
	plan := migrate.Plan{Name: fmt.Sprintf("s%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: strategy}
	rep, err := migrate.Run(ctx, env, plan)
	if kerr := k.result(); kerr != nil {
		t.Fatalf("the fault: %v", kerr)
	}
	if !k.fired() {
		t.Fatalf("the source's sidecar was never killed: the migration (%v) made no stop", err)
	}
	if err != nil {
		t.Fatalf("migrate with the source's sidecar restarted after its stop: %v", err)
	}
	for _, w := range rep.Warnings {
		if strings.Contains(w, "restarted after its stop") {
			t.Errorf("the report says the source served again after its stop: %s", w)
		}
	}
	target, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, plan.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expectExact(t, ctx, prod, target)
}

// TestTargetSidecarKilledAfterTheSwitch: once an ms2m migration has
// completed and the target's app (the restored Go consumer) has folded
// what was produced, the target's sidecar is SIGKILLed while the app runs
// on, and the kubelet restarts it with the same env, which still describes
// the replay. The restarted sidecar finds its takeover in its state folder
// (switched.json) and serves instead of replaying; the app reconnects by
// itself and takes the messages produced after the restart: it ends with
// msg-1..msg-250 once each. Before the record the new sidecar replayed the
// log again, to an app that had folded it.
//
// The kill comes when the app holds nothing and its acks are upstream: a
// SIGKILL while it works on a delivery, or with an ack on its way, loses
// that ack, and the app folds the broker's redelivery again (the known gap
// in docs/faults.md; a SIGTERM drains first). The first full run with the
// kill in mid-stream ended 251 of 250.
func TestTargetSidecarKilledAfterTheSwitch(t *testing.T) {
	l := needLab(t, "it kills a container through its node's containerd")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const n1, n2 = 150, 100
	name := testenv.UniqueName("tgtkill")
	pod, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name, name+"-target") })
	prod := produce(t, pod, name, 10, n1, 10)
	plan := migrate.Plan{Name: fmt.Sprintf("t%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: contract.StrategyMS2M}
	if _, err := migrate.Run(ctx, l.Env(nil), plan); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	target, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, plan.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expectExact(t, ctx, prod, target)
	var idle struct {
		Queues []struct {
			InFlight int `json:"inFlight"`
		} `json:"queues"`
		Log struct {
			Pending int `json:"pending"`
		} `json:"log"`
	}
	testenv.Eventually(t, 30*time.Second, "the target's app to hold nothing, every record durable (its acks upstream)", func() bool {
		if sidecarState(ctx, l, target, &idle) != nil || idle.Log.Pending != 0 {
			return false
		}
		for _, q := range idle.Queues {
			if q.InFlight != 0 {
				return false
			}
		}
		return true
	})
	if err := restartSidecar(ctx, l, target); err != nil {
		t.Fatalf("the fault: %v", err)
	}
	var st struct {
		Mode     string `json:"mode"`
		TookOver *struct {
			CutoffID uint64 `json:"cutoffId"`
		} `json:"tookOver"`
	}
	// It answers once it is started, before its log is open.
	testenv.Eventually(t, time.Minute, "the target's restarted sidecar to open its log", func() bool {
		return sidecarState(ctx, l, target, &st) == nil && st.Mode != "starting"
	})
	if st.TookOver == nil || st.Mode != "serving" {
		t.Errorf("the target's restarted sidecar: mode %q, took over %+v; want serving, having taken over", st.Mode, st.TookOver)
	}
	t.Logf("the target's app had folded %d messages when its sidecar was killed; it restarted %s, taken over at %+v", n1, st.Mode, st.TookOver)
	more, err := lab.StartProducerFrom(testenv.Build(t, "examples/producer"), name, 10, n1+1, n2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(more.Stop)
	if _, err := more.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	want := lab.ProducerResult{Count: n1 + n2, Hash: lab.PrefixHash(n1 + n2)}
	if got := lab.WaitFor(target, want, 30*time.Second); got.Count != want.Count || got.Hash != want.Hash || got.Skipped != 0 {
		t.Errorf("the consumer in %s: count %d hash %s, %d redeliveries skipped; want msg-1..msg-%d once each (hash %s): %v",
			target.Name, got.Count, got.Hash, got.Skipped, want.Count, want.Hash, lab.CheckPrefix(got))
	}
}

// restartSidecar kills pod's sidecar and waits until the kubelet has
// started it again and it answers, stopped or not: a source's migration
// goes on with a sidecar that restarted since its stop.
func restartSidecar(ctx context.Context, l *lab.Lab, pod *corev1.Pod) error {
	cur, err := l.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	restarts := int32(0)
	for _, cs := range cur.Status.InitContainerStatuses {
		restarts += cs.RestartCount
	}
	if err := killContainer(ctx, l, cur, killSidecar); err != nil {
		return err
	}
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		cur, err = l.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := int32(0)
		for _, cs := range cur.Status.InitContainerStatuses {
			now += cs.RestartCount
		}
		var st struct {
			Mode string `json:"mode"`
		}
		if now > restarts && sidecarState(ctx, l, cur, &st) == nil && st.Mode != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("the sidecar in %s did not answer again within 90 s of its kill", pod.Name)
}

// killAfterStop is the migrator's transport to the sidecars, with a fault:
// once the sidecar at host has answered a POST /stop, kill runs before the
// answer reaches the migrator.
type killAfterStop struct {
	base http.RoundTripper
	host string
	kill func(ctx context.Context) error

	once sync.Once
	mu   sync.Mutex
	done bool
	err  error
}

func (k *killAfterStop) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := k.base.RoundTrip(req)
	if err != nil || req.Method != http.MethodPost || req.URL.Path != "/stop" || req.URL.Hostname() != k.host || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	// The answer is read before its sender dies.
	body, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if rerr != nil {
		return nil, rerr
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	k.once.Do(func() {
		err := k.kill(context.WithoutCancel(req.Context()))
		k.mu.Lock()
		k.done, k.err = true, err
		k.mu.Unlock()
	})
	return resp, nil
}

func (k *killAfterStop) fired() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.done
}

func (k *killAfterStop) result() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}
