package e2e

import (
	"context"
	"os/exec"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestSpringConsumerMigration moves the unmodified Spring Boot consumer
// (examples/consumer-spring: a @RabbitListener with Spring's defaults,
// prefetch 250 and AUTO acks, configured by SPRING_RABBITMQ_ADDRESSES,
// _USERNAME and _PASSWORD, which the webhook's injection rewrites) from node
// 1 to node 2 by ms2m and by ms2m-cutoff while the producer sends: a JVM checkpointed by CRIU
// through the kubelet and restored on the other node, its connection found
// closed and opened again by Spring's listener container, the replay
// bringing it up to date. Its hash must equal the producer's, nothing
// skipped. Its image is Debian's JRE from this host plus the jar, built at
// test time (lab.PushSpring).
func TestSpringConsumerMigration(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process, admitting targets itself")
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	if _, err := exec.LookPath("mvn"); err != nil {
		testenv.Missing(t, "Maven, to build the Spring consumer", "run `make setup`, which installs openjdk-17-jdk-headless and maven")
	}
	if err := l.PushSpring(ctx); err != nil {
		t.Fatal(err)
	}
	for _, strategy := range []contract.Strategy{contract.StrategyMS2M, contract.StrategyMS2MCutoff} {
		t.Run(string(strategy), func(t *testing.T) {
			rep, gap := migrateWhileProducing(t, l, scenario{strategy: strategy, image: "consumer-spring", n: 300, rate: 10, workMS: 50})
			t.Logf("Spring consumer by %s: total %v, switch %v, processing gap %v",
				strategy, rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), gap.Round(time.Millisecond))
		})
	}
}

// waitAppConnected waits until the sample consumer in pod has a consumer
// on the broker.
func waitAppConnected(t *testing.T, pod *corev1.Pod, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, "the consumer in "+pod.Name+" to consume", func() bool {
		st, err := lab.GetAppState(pod)
		return err == nil && st.Connected
	})
}
