package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/testenv"
)

// Which real migration covers what (G: the Go consumer, Py: the Python
// one, S: the Spring Boot one, N: the NATS one). Bare pods are moved by migrate.Run, owned
// pods by the controller after the ms2m.io/migrate-to annotation; the CLI
// moves a bare pod by ms2m (TestMigratorCLI), and so do the agents and the
// webhook tests.
//
//	strategy            bare pod, migrate.Run        Deployment/StatefulSet, annotation
//	ms2m                G, Py (FirstRealMigration)   G Deployment (auto); G bare (AnnotationTriggers)
//	                    S (SpringConsumerMigration)
//	                    N push, pull (NATSMigration)
//	stop-and-copy       G, Py (FirstRealMigration)   G Deployment; N Deployment (NATSEveryStrategy)
//	ms2m-cutoff         G (FirstRealMigration)       Py Deployment; N Deployment (NATSEveryStrategy)
//	                    S (SpringConsumerMigration)
//	statefulset         -                            G, Py StatefulSet; N StatefulSet (NATSEveryStrategy)
//	statefulset-shadow  -                            G StatefulSet; Py StatefulSet (auto); S StatefulSet
//	                                                 N StatefulSet (auto; NATSEveryStrategy)
//
// Broker configurations: TestTLSBrokerFromSecretMigration moves a G bare
// pod by ms2m whose amqps:// URL (the broker's TLS port) and CA are in
// Secrets (tls_test.go). The S runs are configured as Spring services are:
// by ms2m, a mounted application.properties from a Secret, the listener
// container transacted; by ms2m-cutoff, SPRING_RABBITMQ_* from a Secret
// with two addresses whose first broker is down; the StatefulSet,
// SPRING_RABBITMQ_* from a Secret (spring_test.go). TestServerNamedQueueRefused
// has a G bare pod on a server-named queue refused before any checkpoint
// (unreplayable_test.go).
//
// NATS (nats_test.go; N: the NATS consumer, examples/consumer-nats,
// nats.go): TestNATSMigration moves N as a bare pod by ms2m, push and
// pull; TestNATSEveryStrategy moves N (pull) by annotation as a
// Deployment's pod by ms2m-cutoff and stop-and-copy and as a
// StatefulSet's by statefulset and statefulset-shadow (auto). CRIU alone
// is refused for NATS pods.
//
// A whole pod: TestTwoContainerPod moves a bare pod of two G consumers,
// each on its own queue, by ms2m, and TestTwoContainerStatefulSet a
// StatefulSet's such pod by statefulset (the controller, by annotation),
// each container from its own checkpoint image (wholepod_test.go).
//
// Again and again: TestPingPong moves a G Deployment (auto, ms2m) and a G
// StatefulSet (statefulset-shadow) back and forth between the nodes by
// annotation (pingpong_test.go).
//
// Every row of TestEveryStrategyByAnnotation checks all of it: the pod on
// the target node and the source gone, the pod owned by its controller
// again, no pod ever started with empty state, the producer's hash, the
// status annotation's strategy, times and phases, and the Events.

// TestEveryStrategyByAnnotation moves a Deployment's or a StatefulSet's
// pod, an unmodified Go or Python consumer that opted in by annotation and
// that the real webhook injected, from node 1 to node 2 by annotating it
// with ms2m.io/migrate-to, by every strategy that applies to its owner.
func TestEveryStrategyByAnnotation(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withController)

	for _, tc := range []struct {
		name     string
		kind     lab.Kind
		image    string            // "consumer" (Go) or "consumer-python"
		strategy contract.Strategy // the ms2m.io/strategy annotation; "" leaves it to auto
		want     contract.Strategy
		phases   []string // besides those every strategy has
		pods     int      // ever made: the first, the target, and the shadow if any
		// configure, if set, configures the consumer's broker another way.
		configure func(t *testing.T, ctx context.Context, l *lab.Lab) springConfig
	}{
		{name: "go/deployment/auto", kind: lab.Deployment, image: "consumer", want: contract.StrategyMS2M,
			phases: []string{"quiesce", "checkpoint", "resume", "image", "replay and handover"}, pods: 2},
		{name: "go/deployment/stop-and-copy", kind: lab.Deployment, image: "consumer", strategy: contract.StrategyStopAndCopy, want: contract.StrategyStopAndCopy,
			phases: []string{"stop", "checkpoint", "image", "switch"}, pods: 2},
		{name: "python/deployment/ms2m-cutoff", kind: lab.Deployment, image: "consumer-python", strategy: contract.StrategyMS2MCutoff, want: contract.StrategyMS2MCutoff,
			phases: []string{"quiesce", "checkpoint", "resume", "image", "replay and handover"}, pods: 2},
		{name: "go/statefulset/statefulset", kind: lab.StatefulSet, image: "consumer", strategy: contract.StrategyStatefulSet, want: contract.StrategyStatefulSet,
			phases: []string{"quiesce", "checkpoint", "image", "stop", "switch"}, pods: 2},
		{name: "python/statefulset/statefulset", kind: lab.StatefulSet, image: "consumer-python", strategy: contract.StrategyStatefulSet, want: contract.StrategyStatefulSet,
			phases: []string{"quiesce", "checkpoint", "image", "stop", "switch"}, pods: 2},
		{name: "go/statefulset/statefulset-shadow", kind: lab.StatefulSet, image: "consumer", strategy: contract.StrategyStatefulSetShadow, want: contract.StrategyStatefulSetShadow,
			phases: []string{"quiesce", "shadow restore", "shadow handover", "shadow checkpoint", "handover"}, pods: 3},
		{name: "python/statefulset/auto", kind: lab.StatefulSet, image: "consumer-python", want: contract.StrategyStatefulSetShadow,
			phases: []string{"quiesce", "shadow restore", "shadow handover", "shadow checkpoint", "handover"}, pods: 3},
		// The JVM checkpointed, restored as the shadow, checkpointed again
		// and restored as the StatefulSet's pod; its broker settings in a
		// Secret (SPRING_RABBITMQ_* valueFrom secretKeyRef).
		{name: "spring/statefulset/statefulset-shadow", kind: lab.StatefulSet, image: "consumer-spring", strategy: contract.StrategyStatefulSetShadow, want: contract.StrategyStatefulSetShadow,
			phases: []string{"quiesce", "shadow restore", "shadow handover", "shadow checkpoint", "handover"}, pods: 3,
			configure: func(t *testing.T, ctx context.Context, l *lab.Lab) springConfig {
				return springEnvFromSecret(t, ctx, l, l.BrokerAMQP)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.image == "consumer-spring" {
				needSpring(t, ctx, l)
			}
			if _, ok := l.Images[tc.image]; !ok {
				testenv.Missing(t, "the "+tc.image+" image (Debian's python3-pika on this host)", "run `make setup`, which installs python3-pika")
			}
			ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			name := testenv.UniqueName("own")
			var cfg springConfig
			if tc.configure != nil {
				cfg = tc.configure(t, ctx, l)
			}
			pods := watchPods(t, ctx, l, name)
			src := startWorkload(t, ctx, l, tc.kind, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 50, Image: tc.image, Mutate: cfg.mutate})
			if _, ok := src.Annotations[contract.AnnotationStatus]; !ok {
				t.Fatalf("the webhook did not inject %s", src.Name)
			}
			if tc.image == "consumer-spring" { // a JVM and a Spring context take a while
				waitAppConnected(t, src, 3*time.Minute)
			}
			prod := produce(t, src, name, 10, 150, 20)

			req := map[string]any{contract.AnnotationMigrateTo: l.NodeName(2)}
			if tc.strategy != "" {
				req[contract.AnnotationStrategy] = string(tc.strategy)
			}
			annotate(t, ctx, l, src.Name, req)
			target, st := waitMigrated(t, ctx, l, name, src)
			expectMigrated(t, ctx, l, tc.kind, src, target, st, tc.want, tc.phases)
			expectExact(t, ctx, prod, target)
			expectNoEmptyReplica(t, pods, src.UID, tc.pods)
			checkNoSecretValue(t, target, cfg.secretValues...)
		})
	}
}

// copyPhases are the phases every strategy reports.
var copyPhases = []string{"preconditions", "prepare target", "restore", "finalise"}

// expectMigrated checks what a migration by annotation of src, the pod of
// a Deployment or StatefulSet (kind), must leave, once the controller
// reports it Succeeded on target (st): the pod on node 2 and the source
// gone, the pod owned by its controller again, the status annotation's
// strategy (want), times and phases (phases, besides copyPhases), each
// phase's Event, and no pending-migration ConfigMap or shadow left. The
// messages are the caller's to check.
func expectMigrated(t *testing.T, ctx context.Context, l *lab.Lab, kind lab.Kind, src, target *corev1.Pod, st controller.Status, want contract.Strategy, phases []string) {
	t.Helper()
	owner := metav1.GetControllerOf(src)
	if owner == nil {
		t.Fatalf("%s has no controller", src.Name)
	}
	rep := st.Report
	if rep == nil {
		t.Fatalf("the status of %s has no report: %+v", target.Name, st)
	}
	t.Logf("%s: total %v, switch %v, checkpoint %d, cutoff %d; phases %v (the processing gap is logged by the tests that read the journals: TestFirstRealMigration, TestPingPong, the TestNATS ones)", rep.Strategy, rep.Total.Round(time.Millisecond),
		rep.Downtime.Round(time.Millisecond), rep.Start, rep.CutoffID, rep.Phases)

	if target.Spec.NodeName != l.NodeName(2) {
		t.Errorf("%s runs on %s, want %s", target.Name, target.Spec.NodeName, l.NodeName(2))
	}
	if p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, src.Name, metav1.GetOptions{}); err == nil && p.UID == src.UID {
		t.Errorf("the source %s (%s) is still there", src.Name, src.UID)
	} else if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("the source %s: %v", src.Name, err)
	}
	if c := metav1.GetControllerOf(target); c == nil || c.UID != owner.UID {
		t.Errorf("%s is controlled by %v, want %s %s", target.Name, c, owner.Kind, owner.Name)
	}
	if st.Strategy != string(want) || rep.Strategy != want {
		t.Errorf("status strategy %q, report strategy %q, want %s", st.Strategy, rep.Strategy, want)
	}
	if rep.Total <= 0 || rep.Downtime <= 0 || rep.Downtime >= rep.Total {
		t.Errorf("total %v, downtime %v: want 0 < downtime < total", rep.Total, rep.Downtime)
	}
	if missing := missingPhases(rep, append(append([]string(nil), phases...), copyPhases...)); len(missing) > 0 {
		t.Errorf("the status lacks the phases %q: %v", missing, rep.Phases)
	}
	if want == contract.StrategyMS2MCutoff && (rep.TCutoff <= 0 || rep.Lambda <= 0) {
		t.Errorf("ms2m-cutoff sized T_cutoff %v from λ %v μ %v: want measured rates", rep.TCutoff, rep.Lambda, rep.Mu)
	}
	waitEvent(t, ctx, l, src, contract.ReasonMigrationStarted)
	for _, ph := range rep.Phases { // each phase its own Event, with its own note
		waitEventSaying(t, ctx, l, src, contract.ReasonMigrationPhase, ": "+ph.Name+" took ")
	}
	waitEvent(t, ctx, l, target, contract.ReasonMigrationSucceeded)
	if kind == lab.StatefulSet {
		if _, err := l.Client.CoreV1().ConfigMaps(lab.Namespace).Get(ctx, contract.PendingConfigMapName(src.Name), metav1.GetOptions{}); err == nil {
			t.Errorf("the pending-migration ConfigMap is still there")
		}
	}
	if rep.ShadowPod != "" {
		testenv.Eventually(t, time.Minute, "the shadow is gone", func() bool {
			_, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, rep.ShadowPod, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	}
}
