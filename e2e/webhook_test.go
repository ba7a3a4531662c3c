package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
	"github.com/ms2m/ms2m/internal/webhook"
)

// TestRealWebhook runs the webhook binary on the host, registered with the
// lab's API server by URL. A consumer pod created through the API with
// only the opt-in annotation comes out injected, as Admit would inject it,
// and runs; an ms2m migration of it, with the webhook (not Env.Admit)
// turning the target into a restore, ends with the producer's hash; and
// the webhook's Events and metrics record both admissions.
func TestRealWebhook(t *testing.T) {
	l := needLab(t, "it runs a webhook of its own and reads its log and metrics")
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()

	wh, err := l.StartWebhook(ctx)
	if err != nil {
		t.Fatalf("start the webhook: %v", err)
	}
	t.Cleanup(func() {
		if err := l.StopWebhook(); err != nil {
			t.Errorf("stop the webhook: %v", err)
		}
		if _, err := l.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.WithoutCancel(t.Context()), lab.WebhookConfigName, metav1.GetOptions{}); err == nil {
			t.Errorf("the MutatingWebhookConfiguration %s is still there after StopWebhook", lab.WebhookConfigName)
		}
	})
	t.Logf("webhook pid %d serving %s; log %s", wh.PID(), wh.URL, wh.LogFile)
	env := l.Env(func(phase string, took time.Duration) {
		t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond))
	})
	if env.Admit != nil {
		t.Fatal("lab.Env set Admit while the webhook runs: the target would be admitted twice")
	}

	name := testenv.UniqueName("c-webhook")
	plan := migrate.Plan{
		Name: fmt.Sprintf("m%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: contract.StrategyMS2M,
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		if !(t.Failed() && os.Getenv("MS2M_E2E_KEEP") != "") {
			logCleanup(t, "delete pods", l.DeletePods(ctx, plan.Pod, plan.TargetPod))
		}
		b := testenv.RequireBroker(t)
		logName := inject.DefaultLogName(lab.Namespace, name)
		logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, b.StreamURI, logName))
		logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, b.StreamURI, inject.OwnLogName(logName, plan.Name)))
	})

	// (a) The pod as a user writes it, created through the API server.
	pod, err := l.Pod(lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 0 || len(pod.Annotations) != 1 || pod.Annotations[contract.AnnotationInject] != "true" {
		t.Fatalf("the pod to create should carry only the opt-in annotation and no sidecar; it has annotations %v and %d init containers", pod.Annotations, len(pod.Spec.InitContainers))
	}
	want, err := l.Admit(pod.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	created, err := l.Client.CoreV1().Pods(lab.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s through the webhook: %v", name, err)
	}
	checkInjected(t, l, created, want)
	src, err := migrate.WaitRunning(ctx, l.Client, lab.Namespace, name, 2*time.Minute)
	if err != nil {
		t.Fatalf("the injected pod: %v", err)
	}
	t.Logf("pod %s injected by the webhook and running on %s", name, src.Spec.NodeName)

	// (b) An ms2m migration with the webhook making the target a restore.
	prod := produce(t, src, name, 10, 120, 20)
	journals := l.NewJournals(src, plan)
	progress := env.Progress
	env.Progress = func(phase string, took time.Duration) {
		if progress != nil {
			progress(phase, took)
		}
		journals.AfterPhase(ctx, phase)
	}
	began := time.Now()
	rep, err := migrate.Run(ctx, env, plan)
	ended := time.Now()
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Logf("ms2m: total %v, switch %v, checkpoint ID %d, cutoff %d", rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), rep.Start, rep.CutoffID)

	target, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, plan.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkRestored(t, target, plan, rep)
	if _, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
		t.Errorf("the source pod %s is still there", name)
	}
	wantState, err := prod.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := lab.WaitFor(target, wantState, 30*time.Second)
	t.Logf("ms2m: producer count %d hash %.12s; restored consumer count %d hash %.12s (reconnects %d, skipped redeliveries %d)",
		wantState.Count, wantState.Hash, got.Count, got.Hash, got.Reconnects, got.Skipped)
	logGap(t, "ms2m", journals, target, began, ended)
	if got.Count != wantState.Count || got.Hash != wantState.Hash || got.Skipped != 0 {
		t.Errorf("restored consumer: count %d hash %s, %d redeliveries skipped; producer: count %d hash %s", got.Count, got.Hash, got.Skipped, wantState.Count, wantState.Hash)
	}

	// (c) The webhook's own record of the two admissions.
	inj := waitWebhookEvent(t, l, contract.ReasonInjected, name)
	t.Logf("event %s on pod %s: %s", inj.Reason, name, inj.Note)
	res := waitWebhookEvent(t, l, contract.ReasonRestored, plan.TargetPod)
	t.Logf("event %s on pod %s: %s", res.Reason, plan.TargetPod, res.Note)
	for _, outcome := range []string{"injected", "restored"} {
		if n := admissionCount(t, wh, outcome); n < 1 {
			t.Errorf("ms2m_webhook_admission_requests_total{operation=CREATE,outcome=%s} = %v, want at least 1", outcome, n)
		}
	}
}

// checkInjected compares the pod the webhook admitted with the one Admit
// makes in process from the same spec: the same app env (AMQP_URL
// rewritten), the same sidecar image and env (Secret keys) but for the
// log retention, which the webhook's defaults add, and the same status.
func checkInjected(t *testing.T, l *lab.Lab, got, want *corev1.Pod) {
	t.Helper()
	gotApp, wantApp := container(got.Spec.Containers, "app"), container(want.Spec.Containers, "app")
	gotSC, wantSC := container(got.Spec.InitContainers, inject.SidecarName), container(want.Spec.InitContainers, inject.SidecarName)
	if gotApp == nil || gotSC == nil {
		t.Fatalf("pod %s after admission: app container %v, %s init container %v", got.Name, gotApp != nil, inject.SidecarName, gotSC != nil)
	}
	if gotSC.Image != l.Images["sidecar"] {
		t.Errorf("sidecar image %s, want %s", gotSC.Image, l.Images["sidecar"])
	}
	if gotSC.RestartPolicy == nil || *gotSC.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("the sidecar is not a native sidecar (restartPolicy %v)", gotSC.RestartPolicy)
	}
	if d := cmp.Diff(wantApp.Env, gotApp.Env); d != "" {
		t.Errorf("app env (-Admit +webhook):\n%s", d)
	}
	amqp := envValue(gotApp.Env, "AMQP_URL")
	if u, err := url.Parse(amqp); err != nil || u.Host != fmt.Sprintf("127.0.0.1:%d", inject.DefaultListenPort) {
		t.Errorf("AMQP_URL %q does not point at the sidecar", amqp)
	}
	var gotEnv []corev1.EnvVar
	for _, e := range gotSC.Env {
		if e.Name != "MS2M_LOG_MAX_AGE" && e.Name != "MS2M_LOG_MAX_BYTES" {
			gotEnv = append(gotEnv, e)
		}
	}
	if d := cmp.Diff(wantSC.Env, gotEnv); d != "" {
		t.Errorf("sidecar env but the retention (-Admit +webhook):\n%s", d)
	}
	for _, s := range []struct {
		name string
		want inject.SecretKey
	}{{"MS2M_STREAM_URI", l.Inject.StreamURI}, {"MS2M_CONTROL_TOKEN", l.Inject.ControlToken}} {
		ref := envFrom(gotSC.Env, s.name)
		if ref == nil || ref.Name != s.want.Name || ref.Key != s.want.Key {
			t.Errorf("sidecar %s from %+v, want Secret %s key %s", s.name, ref, s.want.Name, s.want.Key)
		}
	}
	var st inject.Status
	if err := json.Unmarshal([]byte(got.Annotations[contract.AnnotationStatus]), &st); err != nil {
		t.Fatalf("annotation %s %q: %v", contract.AnnotationStatus, got.Annotations[contract.AnnotationStatus], err)
	}
	if d := cmp.Diff(want.Annotations[contract.AnnotationStatus], got.Annotations[contract.AnnotationStatus]); d != "" {
		t.Errorf("annotation %s (-Admit +webhook):\n%s", contract.AnnotationStatus, d)
	}
	t.Logf("status %s", got.Annotations[contract.AnnotationStatus])
	t.Logf("sidecar resources (the webhook's defaults; Admit sets none): requests cpu %s memory %s, limit memory %s",
		gotSC.Resources.Requests.Cpu(), gotSC.Resources.Requests.Memory(), gotSC.Resources.Limits.Memory())
}

// checkRestored checks that the webhook made the target a restore of
// plan's checkpoint on the target node.
func checkRestored(t *testing.T, target *corev1.Pod, plan migrate.Plan, rep migrate.Report) {
	t.Helper()
	var st inject.Status
	if err := json.Unmarshal([]byte(target.Annotations[contract.AnnotationStatus]), &st); err != nil {
		t.Fatalf("target's annotation %s %q: %v", contract.AnnotationStatus, target.Annotations[contract.AnnotationStatus], err)
	}
	if st.Restore != plan.Name {
		t.Errorf("target's status records restore %q, want the migration %q", st.Restore, plan.Name)
	}
	if target.Spec.NodeName != plan.TargetNode {
		t.Errorf("target runs on %s, want %s", target.Spec.NodeName, plan.TargetNode)
	}
	if app := container(target.Spec.Containers, plan.Container); app == nil || app.Image != rep.Image {
		t.Errorf("target's app image is not the checkpoint image %s", rep.Image)
	}
	sc := container(target.Spec.InitContainers, inject.SidecarName)
	if sc == nil || envValue(sc.Env, "MS2M_REPLAY_START") != fmt.Sprint(rep.Start) || envValue(sc.Env, "MS2M_REPLAY_CUTOFF") != "marker" {
		t.Errorf("target's sidecar does not replay from %d to the marker", rep.Start)
	}
}

// waitWebhookEvent waits for the webhook's Event with reason about the
// bare pod name (regarded by name: it had no UID yet).
func waitWebhookEvent(t *testing.T, l *lab.Lab, reason, pod string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	testenv.Eventually(t, 30*time.Second, "a "+reason+" event about pod "+pod, func() bool {
		list, err := l.Client.EventsV1().Events(lab.Namespace).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Reason == reason && e.Regarding.Kind == "Pod" && e.Regarding.Name == pod {
				found = e
				return true
			}
		}
		return false
	})
	if found.ReportingController != webhook.EventSource {
		t.Errorf("%s event reported by %q, want %q", reason, found.ReportingController, webhook.EventSource)
	}
	return found
}

// admissionCount reads the webhook's CREATE counter for outcome from its
// /metrics.
func admissionCount(t *testing.T, wh *lab.Webhook, outcome string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + wh.MetricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("webhook metrics: %v", err)
	}
	defer resp.Body.Close()
	prefix := fmt.Sprintf(`ms2m_webhook_admission_requests_total{operation="CREATE",outcome=%q} `, outcome)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			var n float64
			if _, err := fmt.Sscan(v, &n); err != nil {
				t.Fatalf("%s%s: %v", prefix, v, err)
			}
			t.Logf("%s%v", prefix, n)
			return n
		}
	}
	return 0
}

func container(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

func envValue(env []corev1.EnvVar, name string) string {
	for _, e := range env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func envFrom(env []corev1.EnvVar, name string) *corev1.SecretKeySelector {
	for _, e := range env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef
		}
	}
	return nil
}
