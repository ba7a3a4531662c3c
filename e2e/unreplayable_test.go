package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestServerNamedQueueRefused asks migrate.Run to move, by ms2m on real
// nodes, the unmodified Go consumer subscribed to a fanout exchange through
// a queue the broker named (EXCHANGE: amq.gen-*, exclusive, auto-delete),
// which a restored app could not find again. The migrator must refuse it
// before any checkpoint, naming the queue and why: no phase past the
// preconditions, no checkpoint archive on the node, no target pod, and the
// source pod untouched and still consuming.
func TestServerNamedQueueRefused(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process and reads the node's checkpoint folder")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	name := testenv.UniqueName("c-server-named")
	exchange := name + "-fanout"
	t.Cleanup(func() { deleteExchange(t, exchange) })
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50, Image: "consumer",
		Mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "EXCHANGE", Value: exchange})
		}})
	if err != nil {
		t.Fatal(err)
	}
	plan := migrate.Plan{Name: fmt.Sprintf("m%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: contract.StrategyMS2M}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		logCleanup(t, "delete pods", l.DeletePods(ctx, plan.Pod, plan.TargetPod))
	})
	waitAppConnected(t, src, time.Minute)
	if n := checkpointArchives(t, l, 1, name); n != 0 {
		t.Fatalf("node 1's checkpoint folder holds %d archives of %s before any migration", n, name)
	}

	var phases []string
	_, err = migrate.Run(ctx, l.Env(func(phase string, took time.Duration) {
		t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond))
		phases = append(phases, phase)
	}), plan)
	if err == nil {
		t.Fatalf("migrate.Run moved a consumer of a server-named queue (phases %v)", phases)
	}
	t.Logf("refused: %v", err)
	for _, want := range []string{`queue "amq.gen-`, "server-named", "nothing was checkpointed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	for _, p := range phases {
		if p != "preconditions" {
			t.Errorf("migrate.Run went as far as phase %q before refusing (phases %v)", p, phases)
		}
	}
	if n := checkpointArchives(t, l, 1, name); n != 0 {
		t.Errorf("node 1's checkpoint folder holds %d archives of %s after the refusal", n, name)
	}
	if _, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, plan.TargetPod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the target pod %s: %v, want it never made", plan.TargetPod, err)
	}
	now, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.UID != src.UID || now.Spec.NodeName != cluster.NodeName(1) || restarts(now) != 0 {
		t.Errorf("the source pod is %s on %s with %d restarts, want %s on %s unrestarted", now.UID, now.Spec.NodeName, restarts(now), src.UID, cluster.NodeName(1))
	}
	if st, err := lab.GetAppState(now); err != nil || !st.Connected {
		t.Errorf("the source's consumer after the refusal: %+v, %v; want it still consuming", st, err)
	}
}

// checkpointArchives counts the kubelet's checkpoint archives of pod in
// node i's folder (each named checkpoint-<pod>_<namespace>-<container>-<time>.tar).
func checkpointArchives(t *testing.T, l *lab.Lab, i int, pod string) int {
	t.Helper()
	entries, err := os.ReadDir(l.Cluster.Node(i).CheckpointDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "checkpoint-"+pod+"_") {
			n++
		}
	}
	return n
}

// restarts sums the restart counts of pod's containers.
func restarts(pod *corev1.Pod) int32 {
	var n int32
	for _, cs := range pod.Status.ContainerStatuses {
		n += cs.RestartCount
	}
	return n
}

// deleteExchange deletes exchange on the broker, logging a failure.
func deleteExchange(t *testing.T, exchange string) {
	conn, err := amqp.Dial(testenv.RequireBroker(t).AMQPURL)
	if err != nil {
		t.Logf("cleanup: delete exchange %s: %v", exchange, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		err = ch.ExchangeDelete(exchange, false, false)
	}
	logCleanup(t, "delete exchange "+exchange, err)
}
