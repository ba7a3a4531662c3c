package webhook

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/testenv"
)

const (
	brokerURL = "amqp://app:s3cret@rabbitmq.broker.svc:5672/orders"
	localURL  = "amqp://app:s3cret@127.0.0.1:5672/orders"
)

// newNamespace creates a namespace of its own for t, with labels.
func newNamespace(t *testing.T, c client.Client, labels map[string]string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testenv.UniqueName("t"), Labels: labels}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

// appPod is a consumer pod as a user writes it.
func appPod(ns, name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:  "app",
				Image: "registry.test/consumer:1",
				Env:   []corev1.EnvVar{{Name: "AMQP_URL", Value: brokerURL}, {Name: "WORKERS", Value: "4"}},
			}},
		},
	}
}

func sidecars(pod *corev1.Pod) []corev1.Container {
	var out []corev1.Container
	for _, c := range pod.Spec.InitContainers {
		if c.Name == inject.SidecarName {
			out = append(out, c)
		}
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == inject.SidecarName {
			out = append(out, c)
		}
	}
	return out
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return "<unset>"
}

func status(t *testing.T, pod *corev1.Pod) inject.Status {
	t.Helper()
	raw, ok := pod.Annotations[contract.AnnotationStatus]
	if !ok {
		t.Fatalf("pod %s has no %s annotation", pod.Name, contract.AnnotationStatus)
	}
	var st inject.Status
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		t.Fatalf("%s annotation %q: %v", contract.AnnotationStatus, raw, err)
	}
	return st
}

// requireInjected checks the sidecar, the rewritten broker URL and the
// status annotation of a pod the API server returned.
func requireInjected(t *testing.T, pod *corev1.Pod) corev1.Container {
	t.Helper()
	sc := sidecars(pod)
	if len(sc) != 1 {
		t.Fatalf("pod %s has %d %s containers, want 1 init container; init containers: %v", pod.Name, len(sc), inject.SidecarName, pod.Spec.InitContainers)
	}
	s := sc[0]
	if len(pod.Spec.InitContainers) == 0 || pod.Spec.InitContainers[len(pod.Spec.InitContainers)-1].Name != inject.SidecarName {
		t.Errorf("the sidecar is not an init container: %v", pod.Spec.InitContainers)
	}
	if s.RestartPolicy == nil || *s.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("sidecar restartPolicy = %v, want Always (a native sidecar)", s.RestartPolicy)
	}
	if s.Image != testInject.SidecarImage {
		t.Errorf("sidecar image = %q, want %q", s.Image, testInject.SidecarImage)
	}
	if got := envValue(s, "MS2M_UPSTREAM"); got != "rabbitmq.broker.svc:5672" {
		t.Errorf("sidecar MS2M_UPSTREAM = %q, want rabbitmq.broker.svc:5672", got)
	}
	if got := envValue(pod.Spec.Containers[0], "AMQP_URL"); got != localURL {
		t.Errorf("app AMQP_URL = %q, want %q", got, localURL)
	}
	if got := envValue(pod.Spec.Containers[0], "WORKERS"); got != "4" {
		t.Errorf("app WORKERS = %q, want it untouched (4)", got)
	}
	if st := status(t, pod); st.Sidecar != testInject.SidecarImage || st.Version == "" {
		t.Errorf("status annotation = %+v, want version set and sidecar %s", st, testInject.SidecarImage)
	}
	return s
}

func TestInjectsAnnotatedPod(t *testing.T) {
	c := requireSuite(t)
	t.Parallel()
	ctx := t.Context()
	ns := newNamespace(t, c, nil)
	before := counter(t, "CREATE", outcomeInjected)

	pod := appPod(ns, "consumer", map[string]string{contract.AnnotationInject: "true"})
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("create: %v", err)
	}
	requireInjected(t, pod)

	// What the API server stored, not only what it answered.
	stored := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pod), stored); err != nil {
		t.Fatal(err)
	}
	requireInjected(t, stored)

	if got := counter(t, "CREATE", outcomeInjected); got < before+1 {
		t.Errorf("ms2m_webhook_admission_requests_total{CREATE,injected} = %v, want at least %v", got, before+1)
	}
	// A bare pod with a name: the Event regards it by name.
	ev := waitEvent(t, ns, contract.ReasonInjected, "Pod", "consumer")
	if !strings.Contains(ev.Note, "AMQP_URL") || strings.Contains(ev.Note, "s3cret") {
		t.Errorf("event note %q: want it to name AMQP_URL and not show the password", ev.Note)
	}
}

func TestLeavesPlainPodAlone(t *testing.T) {
	c := requireSuite(t)
	t.Parallel()
	ns := newNamespace(t, c, nil)
	pod := appPod(ns, "plain", nil)
	want := pod.Spec.DeepCopy()
	if err := c.Create(t.Context(), pod); err != nil {
		t.Fatalf("create: %v", err)
	}
	if len(pod.Spec.InitContainers) != 0 || len(pod.Spec.Containers) != 1 {
		t.Errorf("containers changed: init %v, containers %v", pod.Spec.InitContainers, pod.Spec.Containers)
	}
	if diff := cmp.Diff(want.Containers[0].Env, pod.Spec.Containers[0].Env); diff != "" {
		t.Errorf("env changed (-want +got):\n%s", diff)
	}
	if want.Containers[0].Image != pod.Spec.Containers[0].Image || pod.Spec.NodeName != "" {
		t.Errorf("image %q, nodeName %q: want them untouched", pod.Spec.Containers[0].Image, pod.Spec.NodeName)
	}
	if _, ok := pod.Annotations[contract.AnnotationStatus]; ok {
		t.Errorf("plain pod got a %s annotation", contract.AnnotationStatus)
	}
}

func TestNoDoubleInjection(t *testing.T) {
	c := requireSuite(t)
	t.Parallel()
	ctx := t.Context()
	ns := newNamespace(t, c, nil)
	pod := appPod(ns, "once", map[string]string{contract.AnnotationInject: "true"})
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("create: %v", err)
	}
	requireInjected(t, pod)
	firstStatus := pod.Annotations[contract.AnnotationStatus]

	t.Run("update", func(t *testing.T) {
		// An update that does not touch ms2m annotations, and one that
		// adds a valid migration request.
		for _, change := range []func(p *corev1.Pod){
			func(p *corev1.Pod) { p.Labels = map[string]string{"touched": "yes"} },
			func(p *corev1.Pod) { p.Annotations[contract.AnnotationMigrateTo] = "node-b" },
		} {
			p := &corev1.Pod{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil {
				t.Fatal(err)
			}
			change(p)
			if err := c.Update(ctx, p); err != nil {
				t.Fatalf("update: %v", err)
			}
			requireInjected(t, p)
			if got := p.Annotations[contract.AnnotationStatus]; got != firstStatus {
				t.Errorf("status annotation changed on update:\n got %s\nwant %s", got, firstStatus)
			}
		}
	})

	t.Run("re-create the injected spec", func(t *testing.T) {
		copyPod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "once-copy", Annotations: pod.Annotations},
			Spec:       *pod.Spec.DeepCopy(),
		}
		if err := c.Create(ctx, copyPod); err != nil {
			t.Fatalf("create: %v", err)
		}
		requireInjected(t, copyPod)
		if got := copyPod.Annotations[contract.AnnotationStatus]; got != firstStatus {
			t.Errorf("status annotation rewritten on re-create:\n got %s\nwant %s", got, firstStatus)
		}
		if diff := cmp.Diff(pod.Spec.InitContainers, copyPod.Spec.InitContainers); diff != "" {
			t.Errorf("init containers changed on re-create (-first +copy):\n%s", diff)
		}
	})
}

func TestRestoreAnnotations(t *testing.T) {
	c := requireSuite(t)
	t.Parallel()
	ns := newNamespace(t, c, nil)
	pod := appPod(ns, "target", restoreAnnotations(suiteKey, ns, "target", inject.Migration{
		Image: "registry.test/checkpoints/consumer:ckpt-7", Node: "node-b", ReplayStart: "41", ReplayCutoff: "marker",
		LogName: inject.DefaultLogName(ns, "orders-consumer"), Name: "mig-7",
	}, time.Now().Add(time.Hour)))
	if err := c.Create(t.Context(), pod); err != nil {
		t.Fatalf("create: %v", err)
	}
	s := requireInjected(t, pod)
	requireRestore(t, pod, s, "registry.test/checkpoints/consumer:ckpt-7", "node-b", "41", "marker", inject.DefaultLogName(ns, "orders-consumer"), "mig-7")
	waitEvent(t, ns, contract.ReasonRestored, "Pod", "target")
}

func requireRestore(t *testing.T, pod *corev1.Pod, s corev1.Container, image, node, start, cutoff, logName, migration string) {
	t.Helper()
	if got := pod.Spec.Containers[0].Image; got != image {
		t.Errorf("app image = %q, want the checkpoint image %q", got, image)
	}
	if pod.Spec.NodeName != node {
		t.Errorf("nodeName = %q, want %q", pod.Spec.NodeName, node)
	}
	got := map[string]string{}
	for _, k := range []string{"MS2M_REPLAY_START", "MS2M_REPLAY_CUTOFF", "MS2M_LOG_NAME"} {
		got[k] = envValue(s, k)
	}
	want := map[string]string{"MS2M_REPLAY_START": start, "MS2M_REPLAY_CUTOFF": cutoff, "MS2M_LOG_NAME": logName}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sidecar replay env (-want +got):\n%s", diff)
	}
	if st := status(t, pod); st.Restore != migration {
		t.Errorf("status restore = %q, want %q", st.Restore, migration)
	}
}

func TestStatefulSetPendingMigration(t *testing.T) {
	c := requireSuite(t)
	t.Parallel()
	ctx := t.Context()
	ns := newNamespace(t, c, nil)
	owner := metav1.OwnerReference{
		APIVersion: "apps/v1", Kind: "StatefulSet", Name: "web",
		UID: types.UID("0b1e5c3a-7f2d-4c1b-9a9e-6f1c2d3e4f50"), Controller: new(true),
	}
	stsPod := func(name string) *corev1.Pod {
		p := appPod(ns, name, map[string]string{contract.AnnotationInject: "true"})
		p.OwnerReferences = []metav1.OwnerReference{owner}
		return p
	}
	putMigration := func(pod string, data string) {
		t.Helper()
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: contract.PendingConfigMapName(pod)},
			Data:       map[string]string{contract.PendingConfigMapKey: data},
		}
		if err := c.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	mig := inject.Migration{
		Name: "mig-web-0", Image: "registry.test/checkpoints/web-0:ckpt-3", Node: "node-c",
		LogName: inject.DefaultLogName(ns, "web-0"), ReplayStart: "1200", ReplayCutoff: "1350",
	}
	mig.Signature = inject.SignRestore(suiteKey, ns, "web-0", mig, time.Now().Add(time.Hour))
	m, _ := json.Marshal(mig)
	putMigration("web-0", string(m))

	t.Run("pending migration", func(t *testing.T) {
		pod := stsPod("web-0")
		if err := c.Create(ctx, pod); err != nil {
			t.Fatalf("create: %v", err)
		}
		s := requireInjected(t, pod)
		requireRestore(t, pod, s, "registry.test/checkpoints/web-0:ckpt-3", "node-c", "1200", "1350", inject.DefaultLogName(ns, "web-0"), "mig-web-0")
		// The pod has no UID yet: the Event regards its StatefulSet.
		ev := waitEvent(t, ns, contract.ReasonRestored, "StatefulSet", "web")
		if ev.Regarding.UID != owner.UID || ev.Related == nil || ev.Related.Name != "web-0" {
			t.Errorf("event regarding %+v, related %+v: want the StatefulSet's UID and the pod web-0", ev.Regarding, ev.Related)
		}
	})
	t.Run("none pending", func(t *testing.T) {
		pod := stsPod("web-1")
		if err := c.Create(ctx, pod); err != nil {
			t.Fatalf("create: %v", err)
		}
		requireInjected(t, pod)
		if pod.Spec.Containers[0].Image != "registry.test/consumer:1" || pod.Spec.NodeName != "" {
			t.Errorf("web-1 has no pending migration but got image %q, node %q", pod.Spec.Containers[0].Image, pod.Spec.NodeName)
		}
	})
	t.Run("not a StatefulSet pod", func(t *testing.T) {
		// The ConfigMap's name matches, but only StatefulSet pods look.
		putMigration("solo", string(m))
		pod := appPod(ns, "solo", map[string]string{contract.AnnotationInject: "true"})
		if err := c.Create(ctx, pod); err != nil {
			t.Fatalf("create: %v", err)
		}
		requireInjected(t, pod)
		if pod.Spec.NodeName != "" {
			t.Errorf("a bare pod was restored from a pending migration")
		}
	})
	t.Run("bad record is denied", func(t *testing.T) {
		putMigration("web-2", `{"name": "mig-web-2", "image": `)
		err := c.Create(ctx, stsPod("web-2"))
		requireDenied(t, err, contract.PendingConfigMapName("web-2"))
	})
	t.Run("invalid migration is denied", func(t *testing.T) {
		bad, _ := json.Marshal(inject.Migration{Name: "mig-web-3", Image: "x", Node: "Not_A_Node", LogName: inject.DefaultLogName(ns, "web-3"), ReplayStart: "5", ReplayCutoff: "marker"})
		putMigration("web-3", string(bad))
		err := c.Create(ctx, stsPod("web-3"))
		requireDenied(t, err, "mig-web-3")
	})
}

func requireDenied(t *testing.T, err error, wantInMessage ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("the request was admitted; want it denied")
	}
	if !apierrors.IsForbidden(err) {
		t.Errorf("error is not 403 Forbidden: %v", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "denied the request") {
		t.Errorf("error %q: want the webhook's denial", msg)
	}
	for _, w := range wantInMessage {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q: want it to name %q", msg, w)
		}
	}
}

func TestDeniesBadAnnotations(t *testing.T) {
	c := requireSuite(t)
	t.Parallel()
	ctx := t.Context()
	ns := newNamespace(t, c, nil)

	tests := map[string]struct {
		annotations map[string]string
		wantNamed   []string
	}{
		"inject not a bool": {
			annotations: map[string]string{contract.AnnotationInject: "yes"},
			wantNamed:   []string{contract.AnnotationInject, `"yes"`},
		},
		"bad node name": {
			annotations: map[string]string{contract.AnnotationInject: "true", contract.AnnotationMigrateTo: "Node_B"},
			wantNamed:   []string{contract.AnnotationMigrateTo, "Node_B"},
		},
		"override not a bool": {
			annotations: map[string]string{contract.AnnotationInject: "true", contract.AnnotationMigrateForce: "yes"},
			wantNamed:   []string{contract.AnnotationMigrateForce, `"yes"`},
		},
		"unknown strategy": {
			annotations: map[string]string{contract.AnnotationInject: "true", contract.AnnotationStrategy: "teleport"},
			wantNamed:   []string{contract.AnnotationStrategy, "teleport"},
		},
		"incomplete restore": {
			annotations: map[string]string{contract.AnnotationRestoreImage: "registry.test/ckpt:1"},
			wantNamed:   []string{contract.AnnotationRestoreImage, contract.AnnotationRestoreNode},
		},
	}
	for name, tc := range tests {
		t.Run("create/"+name, func(t *testing.T) {
			err := c.Create(ctx, appPod(ns, testenv.UniqueName("bad"), tc.annotations))
			requireDenied(t, err, tc.wantNamed...)
		})
	}

	t.Run("update", func(t *testing.T) {
		pod := appPod(ns, "running", map[string]string{contract.AnnotationInject: "true"})
		if err := c.Create(ctx, pod); err != nil {
			t.Fatalf("create: %v", err)
		}
		requireInjected(t, pod)
		pod.Annotations[contract.AnnotationMigrateTo] = "Node_B"
		pod.Annotations[contract.AnnotationReplayMax] = "soon"
		pod.Annotations[contract.AnnotationCutoff] = "clever"
		err := c.Update(ctx, pod)
		requireDenied(t, err, contract.AnnotationMigrateTo, contract.AnnotationReplayMax, contract.AnnotationCutoff, "use one of formula, adaptive")

		// A pod that was never injected is validated as well.
		plain := appPod(ns, "plain", nil)
		if err := c.Create(ctx, plain); err != nil {
			t.Fatalf("create: %v", err)
		}
		plain.Annotations = map[string]string{contract.AnnotationStrategy: "teleport"}
		requireDenied(t, c.Update(ctx, plain), contract.AnnotationStrategy)
	})
}

func TestNamespaceOptIn(t *testing.T) {
	c := requireSuite(t)
	t.Parallel()
	ctx := t.Context()
	ns := newNamespace(t, c, map[string]string{contract.LabelNamespaceInject: "enabled"})

	pod := appPod(ns, "by-label", nil)
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("create: %v", err)
	}
	requireInjected(t, pod)

	out := appPod(ns, "opted-out", map[string]string{contract.AnnotationInject: "false"})
	if err := c.Create(ctx, out); err != nil {
		t.Fatalf("create: %v", err)
	}
	if len(sidecars(out)) != 0 || envValue(out.Spec.Containers[0], "AMQP_URL") != brokerURL {
		t.Errorf("a pod with %s: \"false\" was injected", contract.AnnotationInject)
	}
	// It asked (by its namespace) and was left alone: that is an Event.
	waitEvent(t, ns, contract.ReasonSkipped, "Pod", "opted-out")

	// generateName, as a ReplicaSet does it: injected, the Event on the
	// owner.
	rs := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "orders-6d4f", UID: "5d7c1a3e-1111-4c1b-9a9e-6f1c2d3e4f51", Controller: new(true)}
	gen := appPod(ns, "", nil)
	gen.GenerateName = "orders-6d4f-"
	gen.OwnerReferences = []metav1.OwnerReference{rs}
	if err := c.Create(ctx, gen); err != nil {
		t.Fatalf("create: %v", err)
	}
	requireInjected(t, gen)
	waitEvent(t, ns, contract.ReasonInjected, "ReplicaSet", "orders-6d4f")
}

// counter reads ms2m_webhook_admission_requests_total for op and outcome.
func counter(t *testing.T, op, outcome string) float64 {
	t.Helper()
	mfs, err := suite.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ms2m_webhook_admission_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labels(m)["operation"] == op && labels(m)["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// waitEvent waits for an Event with reason about the object kind/name in
// namespace ns.
func waitEvent(t *testing.T, ns, reason, kind, name string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	testenv.Eventually(t, 10*time.Second, "a "+reason+" event about "+kind+" "+name, func() bool {
		var list eventsv1.EventList
		if err := suite.client.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Reason == reason && e.Regarding.Kind == kind && e.Regarding.Name == name {
				found = e
				return true
			}
		}
		return false
	})
	if found.ReportingController != EventSource {
		t.Errorf("event reporting controller = %q, want %q", found.ReportingController, EventSource)
	}
	return found
}

// warnings collects the warnings the API server passes on from admission.
type warnings struct {
	mu   sync.Mutex
	text []string
}

func (w *warnings) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	w.text = append(w.text, text)
	w.mu.Unlock()
}

func TestWarningsReachTheClient(t *testing.T) {
	requireSuite(t)
	t.Parallel()
	w := &warnings{}
	cfg := rest.CopyConfig(suite.cfg)
	cfg.WarningHandlerWithContext = w
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, c, nil)
	// A typo under ms2m.io/ is not an error: the pod is injected, and the
	// user is told.
	pod := appPod(ns, "typo", map[string]string{contract.AnnotationInject: "true", "ms2m.io/migrate-too": "node-b"})
	if err := c.Create(t.Context(), pod); err != nil {
		t.Fatalf("create: %v", err)
	}
	requireInjected(t, pod)
	w.mu.Lock()
	defer w.mu.Unlock()
	found := false
	for _, s := range w.text {
		found = found || (strings.Contains(s, "ms2m.io/migrate-too") && strings.Contains(s, contract.AnnotationMigrateTo))
	}
	if !found {
		t.Errorf("warnings %q: want one about ms2m.io/migrate-too that suggests %s", w.text, contract.AnnotationMigrateTo)
	}
}
