package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
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

// TestTLSBrokerFromSecretMigration migrates, by ms2m on real nodes, the
// unmodified Go consumer as it is configured in production: its broker URL
// is amqps:// to the broker's TLS port and sits in a Secret, and the CA in
// another. The webhook gives the app the sidecar with placeholder
// credentials and the sidecar the same Secret keys; no Secret value is in
// the pod spec. The restored consumer's hash equals the producer's.
func TestTLSBrokerFromSecretMigration(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process, admitting pods itself")
	tb := testenv.RequireTLSBroker(t)
	ca, err := os.ReadFile(tb.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, port, _ := net.SplitHostPort(tb.AMQPAddr)
	url := fmt.Sprintf("amqps://%s:%s@%s/", lab.BrokerUser, lab.BrokerPassword, net.JoinHostPort(cluster.HostIP, port))
	urlSecret, caSecret := testenv.UniqueName("tls-broker-url"), testenv.UniqueName("tls-broker-ca")
	createSecret(t, ctx, l, urlSecret, map[string][]byte{"url": []byte(url)})
	createSecret(t, ctx, l, caSecret, map[string][]byte{"ca.crt": ca})
	admitted := false
	sc := scenario{strategy: contract.StrategyMS2M, image: "consumer", n: 120, rate: 10, workMS: 50, mutate: func(p *corev1.Pod) {
		p.Annotations[contract.AnnotationUpstreamTLSSecret] = caSecret
		app := &p.Spec.Containers[0]
		for i, e := range app.Env {
			if e.Name == "AMQP_URL" {
				app.Env[i] = corev1.EnvVar{Name: "AMQP_URL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: urlSecret}, Key: "url"}}}
				admitted = true
			}
		}
	}}
	rep, _ := migrateWhileProducing(t, l, sc)
	if !admitted {
		t.Fatal("the consumer's pod had no AMQP_URL to move into the Secret")
	}
	target, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, rep.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkNoSecretValue(t, target, url, ":"+lab.BrokerPassword+"@")
}

// checkNoSecretValue fails t if the broker URL or password appears in the
// pod's spec or annotations: the webhook must pass Secrets by reference.
func checkNoSecretValue(t *testing.T, pod *corev1.Pod, values ...string) {
	t.Helper()
	spec := pod.Spec.String() + fmt.Sprint(pod.Annotations)
	for _, v := range values {
		if v != "" && strings.Contains(spec, v) {
			t.Errorf("pod %s carries a Secret's value %q in its spec or annotations", pod.Name, v)
		}
	}
}
