package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	nodeagent "github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// brokerCutFor is how long TestBrokerCutOnRealNodes keeps the nodes off
// the broker.
const brokerCutFor = 3 * time.Second

// TestBrokerCutOnRealNodes is the fault matrix's "broker restarted" on
// real nodes (docs/faults.md): during an ms2m migration, every connection
// the nodes and pods have to the broker (the source's sidecar to the queue
// and to its log, the target's log reader, NATS) is reset and new ones are
// refused for 3 s (cluster.CutBroker), which is what a broker restart does
// to its clients. The broker itself is the machine's shared RabbitMQ and is
// not restarted: its queues and streams are kept, as RabbitMQ keeps durable
// queues across a restart. The cut comes as the checkpoint is asked for
// (the source quiesced), and once the target runs (its sidecar replays the
// log while the source serves), twice while the source's app holds no
// delivery and once while it works on one: its sidecar keeps the app's
// connection until the app acked it and absorbs the broker's redelivery
// (before: doubled, 151 of 150).
// Each migration must complete exact or roll
// back exact: the serving consumer's count and hash the producer's, no
// redelivery skipped, no target left after a rollback, no source after a
// completion, no pending-migration record and no checkpoint archive of the
// pod on its node. Runs with MS2M_E2E_FAULTS=1, as the other real-node
// faults.
func TestBrokerCutOnRealNodes(t *testing.T) {
	if os.Getenv("MS2M_E2E_FAULTS") != "1" {
		t.Skip("the real-node faults run with MS2M_E2E_FAULTS=1 (make e2e and make test set it)")
	}
	l := needLab(t, "it cuts the suite's own cluster off the broker")
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	agents, err := l.StartAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agents.Stop)
	ac, err := l.AgentClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		rate float64 // the producer's messages a second
		// open names the defect a case shows; it runs with
		// MS2M_E2E_OPEN_DEFECTS=1.
		open string
		arm  func(ctx context.Context, a *faultyAgent, src *corev1.Pod, target string, fire func())
	}{
		{"in the checkpoint", 2, "", func(ctx context.Context, a *faultyAgent, src *corev1.Pod, target string, fire func()) {
			// The migration begins right after the source's app folded
			// (and acked) a message that was not waiting: the next one is
			// sent 500 ms after it, and the quiesce comes first (within
			// 300 ms here), so the app holds no delivery at the
			// checkpoint. (Before the sidecar drained and absorbed, one it
			// held was doubled: a run that cut the broker 112 ms into a
			// migration begun at any moment doubled msg-11.)
			afterFold(ctx, src, func(f lab.Fold) bool {
				return time.Since(time.Unix(0, f.SentNS)) < 150*time.Millisecond
			}, func() {})
			a.onCheckpoint = fire
		}},
		{"in the replay, between the source's deliveries", 5, "", func(ctx context.Context, a *faultyAgent, src *corev1.Pod, target string, fire func()) {
			// Once the target runs, right after the source's app folded
			// (and acked) a message that was not waiting: the next one is
			// sent 200 ms after it and the app works 50 ms on each, so it
			// holds no delivery for the next 100 ms and more.
			go func() {
				waitRunning(ctx, l, target)
				afterFold(ctx, src, func(f lab.Fold) bool {
					return time.Since(time.Unix(0, f.SentNS)) < 120*time.Millisecond
				}, fire)
			}()
		}},
		{"in the replay, while the source's app works on a delivery", 10, "", func(ctx context.Context, a *faultyAgent, src *corev1.Pod, target string, fire func()) {
			// Once the target runs, 70 ms after the source's app folded
			// a message: the producer sends one each 100 ms and the app
			// works 50 ms on each, so the next one is in its hands.
			go func() {
				waitRunning(ctx, l, target)
				afterFold(ctx, src, func(lab.Fold) bool {
					time.Sleep(70 * time.Millisecond)
					return true
				}, fire)
			}()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.open != "" && os.Getenv("MS2M_E2E_OPEN_DEFECTS") != "1" {
				t.Skip(tc.open + "; MS2M_E2E_OPEN_DEFECTS=1 runs it")
			}
			// The arm's watch ends with the case: a fault fired later
			// would touch a finished test.
			actx, acancel := context.WithCancel(ctx)
			defer acancel()
			faultedMigration(t, ctx, l, ac, "brokercut", tc.rate, func(t *testing.T, a *faultyAgent, src *corev1.Pod, target string) <-chan string {
				fired := make(chan string, 1)
				var once sync.Once
				armed := time.Now()
				tc.arm(actx, a, src, target, func() {
					once.Do(func() {
						n, end, err := l.Cluster.CutBroker(brokerCutFor)
						if err != nil {
							fired <- "cut the broker: " + err.Error()
							return
						}
						t.Cleanup(func() { logCleanup(t, "lift the broker cut", end()) })
						t.Logf("the broker cut off the nodes for %v, %v after the fault was armed: %d connections reset", brokerCutFor, time.Since(armed).Round(time.Millisecond), n)
						if n == 0 {
							fired <- "the cut reset no connection: the source's sidecar had none to the broker"
							return
						}
						fired <- ""
					})
				})
				return fired
			})
		})
	}
}

// kubeletStoppedFor is how long TestTargetKubeletStoppedOnRealNodes keeps
// the target's kubelet stopped once the target pod exists.
const kubeletStoppedFor = 5 * time.Second

// TestTargetKubeletStoppedOnRealNodes is the fault matrix's "kubelet
// stopped, target" in the restore on real nodes (docs/faults.md): the
// target node's kubelet is stopped (SIGSTOP, cluster.StopKubelet) as the
// checkpoint image is built, so the target pod is made while its node's
// kubelet is away, and it is continued (SIGCONT) 5 s after the target pod
// exists, still not started. The migration completes exact (the target
// starts once its kubelet is back, within the migration's timeout) or
// rolls back exact, and leaves nothing behind. The kubelet is continued
// on failure too (t.Cleanup; a dead test's is continued by the next Up).
func TestTargetKubeletStoppedOnRealNodes(t *testing.T) {
	if os.Getenv("MS2M_E2E_FAULTS") != "1" {
		t.Skip("the real-node faults run with MS2M_E2E_FAULTS=1 (make e2e and make test set it)")
	}
	l := needLab(t, "it stops a kubelet of the suite's own cluster")
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	agents, err := l.StartAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agents.Stop)
	ac, err := l.AgentClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	faultedMigration(t, ctx, l, ac, "kubeletstop", 10, func(t *testing.T, a *faultyAgent, src *corev1.Pod, target string) <-chan string {
		fired := make(chan string, 1)
		var once sync.Once
		a.onBuild = func() {
			once.Do(func() {
				start, err := l.Cluster.StopKubelet(2)
				if err != nil {
					fired <- "stop the target's kubelet: " + err.Error()
					return
				}
				t.Cleanup(func() { logCleanup(t, "continue the target's kubelet", start()) })
				go func() {
					// The target pod made while the kubelet is stopped,
					// then the kubelet kept away for a while: the restore
					// waits for it.
					var p *corev1.Pod
					for ctx.Err() == nil {
						got, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, target, metav1.GetOptions{})
						if err == nil {
							p = got
							break
						}
						time.Sleep(50 * time.Millisecond)
					}
					if p == nil {
						fired <- "the target pod was never made: " + context.Cause(ctx).Error()
						start() //nolint:errcheck // the Cleanup reports it
						return
					}
					select {
					case <-ctx.Done():
					case <-time.After(kubeletStoppedFor):
					}
					// Still not started: the fault held the restore.
					p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, target, metav1.GetOptions{})
					if err := start(); err != nil {
						fired <- "continue the target's kubelet: " + err.Error()
						return
					}
					switch {
					case apierrors.IsNotFound(err):
						t.Logf("the target pod was deleted while the kubelet was stopped")
					case err != nil:
						fired <- "read the target pod: " + err.Error()
						return
					case len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil:
						fired <- "the target ran while its kubelet was stopped: the fault missed the restore"
						return
					default:
						t.Logf("the target's kubelet continued after %v with the target pod %s", kubeletStoppedFor, p.Status.Phase)
					}
					fired <- ""
				}()
			})
		}
		return fired
	})
}

// logDoubled logs the message-ids the consumer in pod folded more than
// once, from its journal.
func logDoubled(t *testing.T, pod *corev1.Pod) {
	folds, dropped, err := lab.GetFolds(pod)
	if err != nil {
		t.Logf("the journal of %s: %v", pod.Name, err)
		return
	}
	seen := map[int64]int{}
	var twice []string
	for _, f := range folds {
		if seen[f.ID]++; seen[f.ID] == 2 {
			twice = append(twice, fmt.Sprintf("msg-%d (sent %s)", f.ID, time.Unix(0, f.SentNS).Format("15:04:05.000")))
		}
	}
	t.Logf("the consumer in %s folded more than once: %v (journal of %d folds, %d dropped)", pod.Name, twice, len(folds), dropped)
}

// waitRunning waits until pod runs (its containers started), or ctx ends.
func waitRunning(ctx context.Context, l *lab.Lab, pod string) {
	for ctx.Err() == nil {
		p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, pod, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// afterFold calls fire once the consumer in pod has folded a message for
// which ok, given the fold, says yes (it may wait). It polls the
// consumer's count every 5 ms and reads its journal when the count grows.
func afterFold(ctx context.Context, pod *corev1.Pod, ok func(lab.Fold) bool, fire func()) {
	last := -1
	for ctx.Err() == nil {
		st, err := lab.GetAppState(pod)
		if err == nil && last >= 0 && st.Count > last {
			folds, _, err := lab.GetFolds(pod)
			if err == nil && len(folds) > 0 && ok(folds[len(folds)-1]) {
				fire()
				return
			}
		}
		if err == nil {
			last = st.Count
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// faultedMigration migrates a consumer from node 1 to node 2 with ms2m
// while a producer sends rate messages a second for 15 s, with the fault arm sets up (it reports on the
// channel it returns: "" once the fault fired, else what went wrong), and
// requires the migration to complete exact or roll back exact and leave
// nothing behind.
func faultedMigration(t *testing.T, ctx context.Context, l *lab.Lab, ac nodeagent.Client, prefix string, rate float64,
	arm func(t *testing.T, a *faultyAgent, src *corev1.Pod, target string) <-chan string) {
	src, tgt := cluster.NodeName(1), cluster.NodeName(2)
	name := testenv.UniqueName(prefix)
	target := name + "-target"
	pod, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: src, WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		logCleanup(t, "delete pods", l.DeletePods(ctx, name, target))
		logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, testenv.RequireBroker(t).StreamURI, inject.LogName(pod)))
	})
	prod := produce(t, pod, name, rate, int(15*rate), 10)

	fa := faultyAgent{Client: ac}
	fired := arm(t, &fa, pod, target)
	env := l.Env(nil)
	env.Agent = fa
	plan := migrate.Plan{Name: fmt.Sprintf("f%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: tgt, TargetPod: target, Strategy: contract.StrategyMS2M, Timeout: 2 * time.Minute}
	rep, err := migrate.Run(ctx, env, plan)
	defer func() {
		var ph []string
		for _, p := range rep.Phases {
			ph = append(ph, fmt.Sprintf("%s %v", p.Name, p.Took.Round(time.Millisecond)))
		}
		t.Logf("phases: %s", strings.Join(ph, ", "))
	}()
	select {
	case why := <-fired:
		if why != "" {
			t.Fatal(why)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the fault never fired: the migration ended (%v) before the moment it waits for", err)
	}
	serving, gone := pod.Name, target
	if err == nil {
		t.Logf("migration completed: %v", rep.Total)
		serving, gone = target, pod.Name
	} else {
		t.Logf("migration rolled back: %v", err)
	}
	testenv.Eventually(t, time.Minute, gone+" gone", func() bool {
		_, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, gone, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	sp, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, serving, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the serving pod %s: %v", serving, err)
	}
	testenv.Eventually(t, time.Minute, serving+"'s sidecar serving", func() bool {
		var st struct {
			Mode string `json:"mode"`
		}
		return sidecarState(ctx, l, sp, &st) == nil && st.Mode == "serving"
	})
	expectExact(t, ctx, prod, sp)
	if t.Failed() {
		logDoubled(t, sp)
	}
	if st, err := lab.GetAppState(sp); err == nil {
		t.Logf("the consumer in %s: %d messages, %d reconnects", serving, st.Count, st.Reconnects)
	}
	if _, err := l.Client.CoreV1().ConfigMaps(lab.Namespace).Get(ctx, contract.PendingConfigMapName(name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pending-migration record of %s is left (%v)", name, err)
	}
	dir := l.Cluster.Node(1).CheckpointDir
	var left []string
	testenv.Eventually(t, time.Minute, "no checkpoint archive of "+name+" on "+src, func() bool {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return false
		}
		left = left[:0]
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "checkpoint-"+name+"_") {
				left = append(left, filepath.Join(dir, e.Name()))
			}
		}
		return len(left) == 0
	})
}
