package e2e

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestSpringConsumerMigration moves the unmodified Spring Boot consumer
// (examples/consumer-spring: a @RabbitListener with Spring's defaults,
// prefetch 250 and AUTO acks) from node 1 to node 2 while the producer
// sends, configured as production services are, once by each strategy
// that moves a bare pod live: a JVM checkpointed by CRIU through the
// kubelet and restored on the other node, its connection found closed and
// opened again by Spring's listener container, the replay bringing it up
// to date. Its hash must equal the producer's, nothing skipped, and no
// Secret value may show in the target's spec.
//
//   - ms2m: the broker (address, user, password) in an
//     application.properties from a Secret, mounted at /app/config, which
//     also makes the listener container transacted
//     (orders.channel-transacted: tx.select, each ack committed): the
//     restored app's consumer must be on a transacted channel.
//   - ms2m-cutoff: SPRING_RABBITMQ_ADDRESSES, _USERNAME and _PASSWORD from
//     a Secret (env valueFrom), the addresses a list of two brokers whose
//     first is down (nothing listens there): the sidecars fail over to the
//     second, as Spring's client would.
//
// statefulset-shadow moves the Spring consumer's StatefulSet in
// TestEveryStrategyByAnnotation. Its image is Debian's JRE from this host
// plus the jar, built at test time (lab.PushSpring).
func TestSpringConsumerMigration(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process, admitting targets itself")
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	needSpring(t, ctx, l)
	for _, tc := range []struct {
		name       string
		strategy   contract.Strategy
		configure  func(t *testing.T, ctx context.Context, l *lab.Lab) springConfig
		transacted bool
	}{
		{name: "ms2m/properties-file/transacted", strategy: contract.StrategyMS2M, transacted: true,
			configure: func(t *testing.T, ctx context.Context, l *lab.Lab) springConfig {
				return springPropertiesFile(t, ctx, l, l.BrokerAMQP, "orders.channel-transacted=true\n")
			}},
		{name: "ms2m-cutoff/env-from-secret/first-broker-down", strategy: contract.StrategyMS2MCutoff,
			configure: func(t *testing.T, ctx context.Context, l *lab.Lab) springConfig {
				return springEnvFromSecret(t, ctx, l, downBroker(t)+","+l.BrokerAMQP)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.configure(t, ctx, l)
			rep, gap := migrateWhileProducing(t, l, scenario{strategy: tc.strategy, image: "consumer-spring", n: 300, rate: 10, workMS: 50, mutate: cfg.mutate,
				check: func(t *testing.T, target *corev1.Pod, queue string) {
					checkNoSecretValue(t, target, cfg.secretValues...)
					if tc.transacted {
						testenv.ExpectTransacted(t, queue)
					}
				}})
			t.Logf("Spring consumer by %s: total %v, switch %v, processing gap %v",
				tc.strategy, rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), gap.Round(time.Millisecond))
		})
	}
}

// needSpring builds and pushes the Spring consumer's image, or fails
// (CI=true) or skips saying what is missing.
func needSpring(t *testing.T, ctx context.Context, l *lab.Lab) {
	t.Helper()
	if _, err := exec.LookPath("mvn"); err != nil {
		testenv.Missing(t, "Maven, to build the Spring consumer", "run `make setup`, which installs openjdk-17-jdk-headless and maven")
	}
	if err := l.PushSpring(ctx); err != nil {
		t.Fatal(err)
	}
}

// springConfig is a configuration of the Spring consumer's broker as a
// production pod writes it: mutate changes the lab's pod (literal
// SPRING_RABBITMQ_* env) into it, and secretValues are what must not show
// in the pod's spec once injected.
type springConfig struct {
	mutate       func(*corev1.Pod)
	secretValues []string
}

// springEnvFromSecret keeps the broker settings in a new Secret (keys
// addresses, username, password) and has the app's SPRING_RABBITMQ_*
// vars refer to it (valueFrom secretKeyRef).
func springEnvFromSecret(t *testing.T, ctx context.Context, l *lab.Lab, addresses string) springConfig {
	t.Helper()
	name := testenv.UniqueName("spring-broker")
	createSecret(t, ctx, l, name, map[string][]byte{
		"addresses": []byte(addresses), "username": []byte(lab.BrokerUser), "password": []byte(lab.BrokerPassword)})
	keys := map[string]string{"SPRING_RABBITMQ_ADDRESSES": "addresses", "SPRING_RABBITMQ_USERNAME": "username", "SPRING_RABBITMQ_PASSWORD": "password"}
	return springConfig{secretValues: []string{addresses}, mutate: func(p *corev1.Pod) {
		app := &p.Spec.Containers[0]
		for i, e := range app.Env {
			if key, ok := keys[e.Name]; ok {
				app.Env[i] = corev1.EnvVar{Name: e.Name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}}}
				delete(keys, e.Name)
			}
		}
		if len(keys) > 0 {
			t.Errorf("the Spring consumer's pod has none of %v to move into Secret %s", keys, name)
		}
	}}
}

// springPropertiesFile keeps the broker settings, and extra lines, in an
// application.properties in a new Secret, mounted at /app/config (Spring
// Boot reads ./config/application.properties from its working folder,
// /app, above the jar's own), and takes the SPRING_RABBITMQ_* vars out of
// the app's env.
func springPropertiesFile(t *testing.T, ctx context.Context, l *lab.Lab, addresses, extra string) springConfig {
	t.Helper()
	name := testenv.UniqueName("spring-config")
	props := fmt.Sprintf("spring.rabbitmq.addresses=%s\nspring.rabbitmq.username=%s\nspring.rabbitmq.password=%s\n%s",
		addresses, lab.BrokerUser, lab.BrokerPassword, extra)
	createSecret(t, ctx, l, name, map[string][]byte{"application.properties": []byte(props)})
	return springConfig{secretValues: []string{props, addresses}, mutate: func(p *corev1.Pod) {
		app := &p.Spec.Containers[0]
		env := app.Env[:0]
		for _, e := range app.Env {
			if !strings.HasPrefix(e.Name, "SPRING_RABBITMQ_") {
				env = append(env, e)
			}
		}
		app.Env = env
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "config",
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name}}})
		app.VolumeMounts = append(app.VolumeMounts, corev1.VolumeMount{Name: "config", MountPath: "/app/config", ReadOnly: true})
	}}
}

// createSecret creates Secret name in the lab's namespace, deleted when
// the test ends.
func createSecret(t *testing.T, ctx context.Context, l *lab.Lab, name string, data map[string][]byte) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lab.Namespace}, Data: data}
	if _, err := l.Client.CoreV1().Secrets(lab.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		logCleanup(t, "delete Secret "+name, l.Client.CoreV1().Secrets(lab.Namespace).Delete(ctx, name, metav1.DeleteOptions{}))
	})
}

// downBroker is an address on the cluster's host where no broker listens:
// a port the test took and let go, so that a connection to it is refused
// at once, as to a broker whose node is up and whose process is down.
func downBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(cluster.HostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
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
