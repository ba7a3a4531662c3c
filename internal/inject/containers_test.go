package inject

import (
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// twoContainerPod is testPod with a second container "worker" with env.
func twoContainerPod(annotations map[string]string, env []corev1.EnvVar, workerEnv ...corev1.EnvVar) *corev1.Pod {
	p := testPod(annotations, env...)
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "worker", Image: "example.com/worker:1", Env: workerEnv})
	return p
}

func envOf(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func TestAppContainers(t *testing.T) {
	amqp := []corev1.EnvVar{lit(envAMQPURL, "amqp://rabbit")}
	tests := map[string]struct {
		pod  *corev1.Pod
		want []string
	}{
		"one":   {testPod(nil, amqp...), []string{"app"}},
		"two":   {twoContainerPod(nil, amqp, amqp...), []string{"app", "worker"}},
		"named": {twoContainerPod(map[string]string{contract.AnnotationContainer: "worker"}, amqp, amqp...), []string{"worker"}},
		"none":  {&corev1.Pod{}, nil},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := AppContainers(tt.pod); !slices.Equal(got, tt.want) {
				t.Errorf("AppContainers = %q, want %q", got, tt.want)
			}
			if got, want := AppContainer(tt.pod), append(tt.want, "")[0]; got != want {
				t.Errorf("AppContainer = %q, want the first of AppContainers %q", got, want)
			}
		})
	}
}

// TestInjectEveryAppContainer: both app containers of a pod reach the
// broker through the sidecar; a helper without a broker is left as it is;
// two containers that name different brokers leave the pod alone.
func TestInjectEveryAppContainer(t *testing.T) {
	amqp := []corev1.EnvVar{lit(envAMQPURL, "amqp://rabbit:5672")}
	sidecar := "amqp://127.0.0.1:5672"

	res, err := Inject(Input{Pod: twoContainerPod(nil, amqp, amqp...)}, testConfig)
	if err != nil || res.Pod == nil {
		t.Fatalf("Inject = %+v, %v; want a pod", res, err)
	}
	for _, c := range res.Pod.Spec.Containers {
		if got := envOf(c, envAMQPURL); got != sidecar {
			t.Errorf("container %q: %s = %q, want the sidecar %q", c.Name, envAMQPURL, got, sidecar)
		}
		if got := envOf(c, envGoDebug); got != mptcpOff {
			t.Errorf("container %q: %s = %q, want %q", c.Name, envGoDebug, got, mptcpOff)
		}
	}
	named := false
	for _, l := range res.Rewritten {
		named = named || strings.HasPrefix(l, `container "worker": `+envAMQPURL)
	}
	if !named {
		t.Errorf("no rewritten line names container worker: %q", res.Rewritten)
	}

	helper := twoContainerPod(nil, amqp, lit("LOG_LEVEL", "debug"))
	res, err = Inject(Input{Pod: helper}, testConfig)
	if err != nil || res.Pod == nil {
		t.Fatalf("Inject of a pod with a helper = %+v, %v; want a pod", res, err)
	}
	if got := res.Pod.Spec.Containers[1].Env; len(got) != 1 || got[0] != lit("LOG_LEVEL", "debug") {
		t.Errorf("the helper's env = %+v, want it unchanged", got)
	}
	if !slices.ContainsFunc(res.Skipped, func(s string) bool { return strings.HasPrefix(s, `container "worker": sets no broker`) }) {
		t.Errorf("Skipped = %q, want the helper named", res.Skipped)
	}

	other := twoContainerPod(nil, amqp, lit(envAMQPURL, "amqp://other:5672"))
	res, err = Inject(Input{Pod: other}, testConfig)
	if err != nil || res.Pod != nil {
		t.Fatalf("Inject of two brokers = %+v, %v; want the pod left alone", res, err)
	}
	if !slices.ContainsFunc(res.Skipped, func(s string) bool { return strings.Contains(s, "reach different brokers") }) {
		t.Errorf("Skipped = %q, want why", res.Skipped)
	}

	one, err := Inject(Input{Pod: twoContainerPod(map[string]string{contract.AnnotationContainer: "app"}, amqp, amqp...)}, testConfig)
	if err != nil || one.Pod == nil {
		t.Fatalf("Inject with %s = %+v, %v", contract.AnnotationContainer, one, err)
	}
	if got := envOf(one.Pod.Spec.Containers[1], envAMQPURL); got != "amqp://rabbit:5672" {
		t.Errorf("with %s naming app, worker's %s = %q, want it unchanged", contract.AnnotationContainer, envAMQPURL, got)
	}
}

// TestRestoreEveryAppContainer: a restore of a two-container pod runs each
// app container from its own checkpoint image, the signature covers the
// second's, and a name that is no app container is denied.
func TestRestoreEveryAppContainer(t *testing.T) {
	amqp := []corev1.EnvVar{lit(envAMQPURL, "amqp://rabbit:5672")}
	pending := func() *Migration {
		return &Migration{Name: "m", Image: "example.com/ckpt/default:m-app", Node: "node-b", LogName: "default.app-0", ReplayStart: "1", ReplayCutoff: "marker",
			Images: map[string]string{"worker": "example.com/ckpt/default:m-worker"}}
	}
	in := restoreInput(twoContainerPod(nil, amqp, amqp...), pending())
	res, err := Inject(in, testConfig)
	if err != nil || res.Pod == nil {
		t.Fatalf("Inject = %+v, %v; want a restore", res, err)
	}
	got := map[string]string{}
	for _, c := range res.Pod.Spec.Containers {
		got[c.Name] = c.Image
	}
	want := map[string]string{"app": "example.com/ckpt/default:m-app", "worker": "example.com/ckpt/default:m-worker"}
	if !maps.Equal(got, want) {
		t.Errorf("images = %v, want %v", got, want)
	}
	cfg := testConfig
	cfg.CheckpointRepository = "example.com/ckpt"
	if err := CheckImages(res.Pod, nil, cfg, res.Restore); err != nil {
		t.Errorf("CheckImages of the restore it verified: %v", err)
	}
	if err := CheckImages(res.Pod, nil, cfg, &Migration{Image: "example.com/ckpt/default:m-app"}); err == nil {
		t.Error("CheckImages let the worker's checkpoint image through without a restore that names it")
	}

	tampered := restoreInput(twoContainerPod(nil, amqp, amqp...), pending())
	tampered.Pending.Images["worker"] = "example.com/ckpt/default:other"
	if _, err := Inject(tampered, testConfig); err == nil || !strings.Contains(err.Error(), "signature does not match") {
		t.Errorf("Inject of a changed image = %v, want the signature refused", err)
	}

	stray := pending()
	stray.Images = map[string]string{"nosuch": "example.com/ckpt/default:x"}
	if _, err := Inject(restoreInput(twoContainerPod(nil, amqp, amqp...), stray), testConfig); err == nil || !strings.Contains(err.Error(), `"nosuch"`) {
		t.Errorf("Inject naming no app container = %v, want a denial naming it", err)
	}
}

func TestParseImages(t *testing.T) {
	m := map[string]string{"b": "r/x:1", "a": "r/y:2"}
	if got := EncodeImages(m); got != "a=r/y:2,b=r/x:1" {
		t.Errorf("EncodeImages = %q", got)
	}
	if back, msg := ParseImages(EncodeImages(m)); msg != "" || !maps.Equal(back, m) {
		t.Errorf("ParseImages(EncodeImages) = %v, %q", back, msg)
	}
	for _, bad := range []string{"", "a", "a=", "=x", "b=x,a=y", "a=x,a=y", "a=x y"} {
		if _, msg := ParseImages(bad); msg == "" {
			t.Errorf("ParseImages(%q) took it", bad)
		}
	}
}
