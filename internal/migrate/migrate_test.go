package migrate

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
)

func TestKubeletSays(t *testing.T) {
	status := `{"kind":"Status","message":"checkpointing of default/app/app failed: criu failed: type NOTIFY errno 0"}`
	if got := kubeletSays([]byte(status)); !strings.Contains(got, "criu failed") || strings.Contains(got, "kind") {
		t.Errorf("kubeletSays(status) = %q, want the message only", got)
	}
	if got := kubeletSays(nil); got != "" {
		t.Errorf("kubeletSays(nil) = %q, want nothing", got)
	}
}

// TestTargetPodBecomesARestore: the target made from an injected source is
// turned into a restore by the same injection logic the webhook runs.
func TestTargetPodBecomesARestore(t *testing.T) {
	cfg := inject.Config{
		SidecarImage: "ms2m/sidecar:dev",
		StreamURI:    inject.SecretKey{Name: "ms2m", Key: "stream-uri"},
		ControlToken: inject.SecretKey{Name: "ms2m", Key: "token"},
		RestoreKey:   []byte("migrate-test-key-0123456789"),
	}
	app := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: "default", Annotations: map[string]string{contract.AnnotationInject: "true"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "consumer-1", UID: "u"}}},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "app", Image: "ms2m/consumer:dev",
			Env: []corev1.EnvVar{{Name: "AMQP_URL", Value: "amqp://u:p@10.77.0.1:5672/"}}}}},
	}
	res, err := inject.Inject(inject.Input{Pod: app}, cfg)
	if err != nil || res.Pod == nil {
		t.Fatalf("inject the source: %v %+v", err, res)
	}
	source := res.Pod
	source.UID, source.ResourceVersion, source.Spec.NodeName = "uid-1", "7", "node-1"

	target := TargetPod(source, "consumer-m1", Restore{Migration: "m1", Image: "10.77.0.1:5000/ckpt:m1", Node: "node-2", LogName: "default.consumer", Start: 42}, cfg.RestoreKey, time.Now().Add(time.Minute))
	if target.UID != "" || target.ResourceVersion != "" || len(target.OwnerReferences) != 0 || target.Spec.NodeName != "" {
		t.Errorf("target keeps the source's identity: %+v", target.ObjectMeta)
	}
	res, err = inject.Inject(inject.Input{Pod: target}, cfg)
	if err != nil || res.Pod == nil || res.Restore == nil {
		t.Fatalf("inject the target: %v %+v", err, res)
	}
	got := res.Pod
	if got.Spec.NodeName != "node-2" || got.Spec.Containers[0].Image != "10.77.0.1:5000/ckpt:m1" {
		t.Errorf("restore pod: node %q, image %q", got.Spec.NodeName, got.Spec.Containers[0].Image)
	}
	env := map[string]string{}
	for _, c := range got.Spec.InitContainers {
		if c.Name == inject.SidecarName {
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
		}
	}
	if env["MS2M_REPLAY_START"] != "42" || env["MS2M_REPLAY_CUTOFF"] != "marker" || env["MS2M_LOG_NAME"] != "default.consumer" {
		t.Errorf("sidecar replay env = %v", env)
	}
	if source.Annotations[contract.AnnotationRestoreImage] != "" {
		t.Error("TargetPod changed the source's annotations")
	}
}

func TestLogNameOfTheSource(t *testing.T) {
	cfg := inject.Config{SidecarImage: "s", StreamURI: inject.SecretKey{Name: "m", Key: "u"}, ControlToken: inject.SecretKey{Name: "m", Key: "t"}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer-7d9f", Namespace: "shop", Annotations: map[string]string{contract.AnnotationInject: "true"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Env: []corev1.EnvVar{{Name: "AMQP_URL", Value: "amqp://h/"}}}}},
	}
	res, err := inject.Inject(inject.Input{Pod: pod}, cfg)
	if err != nil || res.Pod == nil {
		t.Fatal(err)
	}
	if got := inject.LogName(res.Pod); got != "shop.consumer-7d9f" {
		t.Errorf("LogName = %q, want shop.consumer-7d9f", got)
	}
	if got := inject.LogName(pod); got != "" {
		t.Errorf("LogName of a pod without sidecar = %q", got)
	}
}

func TestCRIULogInError(t *testing.T) {
	msg := `an error on the server ("checkpointing of default/p/app failed (rpc error: code = Unknown desc = checkpointing container \"8b39\" failed: /usr/sbin/runc did not terminate successfully: exit status 1: criu failed: type NOTIFY errno 0 path= /var/lib/containerd/state/k8s.io/8b39/criu-dump.log)") has prevented the request`
	if got := criuLogPath(msg); got != "/var/lib/containerd/state/k8s.io/8b39/criu-dump.log" {
		t.Errorf("criuLogPath = %q", got)
	}
	if got := criuLogPath("checkpoint failed: no log"); got != "" {
		t.Errorf("criuLogPath without a path = %q", got)
	}
	log := "(00.01) Warn (criu/x.c:1): w\n(00.05) Error (criu/sk-inet.c:137): inet: Unsupported proto 262 for socket 4c49e\n(00.06) Error (criu/cr-dump.c:1975): Dumping FAILED.\n"
	want := "  (00.05) Error (criu/sk-inet.c:137): inet: Unsupported proto 262 for socket 4c49e\n  (00.06) Error (criu/cr-dump.c:1975): Dumping FAILED."
	if got := criuErrorLines(log); got != want {
		t.Errorf("criuErrorLines = %q, want %q", got, want)
	}
}

func TestCutoffAfter(t *testing.T) {
	for name, tc := range map[string]struct {
		replayMax  time.Duration
		lambda, mu float64
		limit      time.Duration
		want       time.Duration
	}{
		"paper: λ 16, μ 20":    {replayMax: 8 * time.Second, lambda: 16, mu: 20, want: 10 * time.Second},
		"λ equals μ":           {replayMax: 5 * time.Second, lambda: 20, mu: 20, want: 5 * time.Second},
		"slow producer":        {replayMax: 5 * time.Second, lambda: 4, mu: 20, limit: time.Minute, want: 25 * time.Second},
		"capped":               {replayMax: 5 * time.Second, lambda: 0.1, mu: 20, limit: time.Minute, want: time.Minute},
		"no rates yet":         {replayMax: 3 * time.Second, want: 3 * time.Second},
		"default T_replay_max": {lambda: 10, mu: 20, want: 10 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			if got := CutoffAfter(tc.replayMax, tc.lambda, tc.mu, tc.limit); got != tc.want {
				t.Errorf("CutoffAfter = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestAdaptive: the adaptive cutoff stops the source once the live backlog
// replays within T_replay_max at the target's rate, never without a rate.
func TestAdaptive(t *testing.T) {
	for name, tc := range []struct {
		lag       uint64
		mu        float64
		replayMax time.Duration
		want      bool
	}{
		{lag: 100, mu: 20, replayMax: 5 * time.Second, want: true},
		{lag: 101, mu: 20, replayMax: 5 * time.Second, want: false},
		{lag: 0, mu: 0, replayMax: 5 * time.Second, want: false},
		{lag: 40, mu: 10, want: true}, // default T_replay_max 5 s
		{lag: 51, mu: 10, want: false},
	} {
		if got := Adaptive(tc.lag, tc.mu, tc.replayMax); got != tc.want {
			t.Errorf("%d: Adaptive(%d, %g, %s) = %v, want %v", name, tc.lag, tc.mu, tc.replayMax, got, tc.want)
		}
	}
}

// A kubelet on a loaded node can time out syncing its Secret cache and
// report CreateContainerConfigError for a while; it retries, and the pod
// starts. WaitRunning must not give up on it (it failed a consumer's start
// in the e2e suite), while a missing Secret key stays a certain failure.
func TestPodProblem(t *testing.T) {
	waiting := func(reason, msg string) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "ms2m-sidecar", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}}}}
	}
	for name, tc := range map[string]struct {
		pod  *corev1.Pod
		want string
	}{
		"creating":             {pod: waiting("ContainerCreating", "")},
		"secret cache timeout": {pod: waiting("CreateContainerConfigError", "failed to sync secret cache: timed out waiting for the condition")},
		"configmap cache":      {pod: waiting("CreateContainerConfigError", "failed to sync configmap cache: timed out waiting for the condition")},
		"missing key": {pod: waiting("CreateContainerConfigError", `couldn't find key stream-uri in Secret default/ms2m`),
			want: "container ms2m-sidecar: CreateContainerConfigError: couldn't find key stream-uri in Secret default/ms2m"},
		"image pull": {pod: waiting("ErrImagePull", "not found"), want: "container ms2m-sidecar: ErrImagePull: not found"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := podProblem(tc.pod); got != tc.want {
				t.Errorf("podProblem = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCheckpointRef: a checkpoint image goes to its namespace's repository
// under a tag that only the key's holder can name: the same migration
// names another tag with another key, or in another namespace; a long
// name still makes a valid tag.
func TestCheckpointRef(t *testing.T) {
	key, other := []byte("key-one-0123456789abcdef"), []byte("key-two-0123456789abcdef")
	ref := CheckpointRef("reg.test:5000/ms2m/checkpoints/", "shop", "orders-0-tpj70d", key)
	if !strings.HasPrefix(ref, "reg.test:5000/ms2m/checkpoints/shop:orders-0-tpj70d-") || len(ref) != len("reg.test:5000/ms2m/checkpoints/shop:orders-0-tpj70d-")+tagSecretLen {
		t.Errorf("ref %q: want reg.test:5000/ms2m/checkpoints/shop:orders-0-tpj70d-<%d secret characters>", ref, tagSecretLen)
	}
	if ref != CheckpointRef("reg.test:5000/ms2m/checkpoints", "shop", "orders-0-tpj70d", key) {
		t.Error("the ref is not the same for the same key (the controller must find the image again)")
	}
	for name, again := range map[string]string{
		"another key":       CheckpointRef("reg.test:5000/ms2m/checkpoints", "shop", "orders-0-tpj70d", other),
		"another namespace": CheckpointRef("reg.test:5000/ms2m/checkpoints", "bank", "orders-0-tpj70d", key),
	} {
		_, a, _ := strings.Cut(ref, ":5000/")
		_, b, _ := strings.Cut(again, ":5000/")
		if a[strings.LastIndex(a, "-"):] == b[strings.LastIndex(b, "-"):] {
			t.Errorf("%s: the secret part is the same (%s, %s)", name, ref, again)
		}
	}
	long := CheckpointRef("r/x", "shop", strings.Repeat("a", 300), key)
	tag := long[strings.Index(long, ":")+1:]
	if _, err := name.NewTag("reg.test/x:"+tag, name.StrictValidation); err != nil || len(tag) > MaxTagLen {
		t.Errorf("tag of a long name %q (%d bytes): %v", tag, len(tag), err)
	}
}

// TestOneAppContainer: a pod's app containers are migrated together (a
// whole pod), after the one Plan.Container names; a pod that names its
// app container with ms2m.io/container migrates that one alone, and
// ms2m's sidecar is never among them.
func TestOneAppContainer(t *testing.T) {
	pod := func(annotations map[string]string, names ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "app-0", Annotations: annotations}}
		for _, n := range names {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: n})
		}
		p.Spec.InitContainers = []corev1.Container{{Name: inject.SidecarName}}
		return p
	}
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		container string
		want      string
	}{
		{"one container", pod(nil, "app"), "app", ""},
		{"two containers", pod(nil, "orders", "audit"), "orders", "audit"},
		{"three, the plan's not first", pod(nil, "orders", "audit", "mail"), "audit", "orders,mail"},
		{"no container in the plan", pod(nil, "orders", "audit"), "", "audit"},
		{"one named", pod(map[string]string{contract.AnnotationContainer: "audit"}, "orders", "audit"), "audit", ""},
	} {
		if got := strings.Join(otherApps(tc.pod, tc.container), ","); got != tc.want {
			t.Errorf("%s: the other app containers are %q, want %q", tc.name, got, tc.want)
		}
	}
	if a, b := ContainerTag("orders-0-tpj70d", "shadow"), ShadowName("orders-0-tpj70d"); a == b {
		t.Errorf("container shadow's image tag %s is the shadow's", a)
	}
}
