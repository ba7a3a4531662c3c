package webhook

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
)

// TestDeniesCheckpointImages is issue 20's pull attack, as a tenant that
// may create and update pods in its own namespace performs it against the
// real API server: it names another namespace's checkpoint image (that
// pod's whole memory) directly as an image, without asking for a restore:
// in a container, an init container or an ephemeral container, on a pod
// that never opted in or that is labelled out of ms2m, at creation or by
// an update, and with the reference written as the runtime reads it the
// same (registry in upper case, https's port, by digest). Before this check
// every one of them was admitted. Each is denied, naming the container and
// the image; look-alike repositories are admitted, and so are the
// controller's signed restore and later updates of the restored pod.
func TestDeniesCheckpointImages(t *testing.T) {
	c := requireSuite(t)
	t.Parallel()
	ctx := t.Context()
	tenant, victim := newNamespace(t, c, nil), newNamespace(t, c, nil)
	theirs := suiteCheckpoints + "/" + victim + ":orders-x1-0a1b2c3d4e5f6a7b8c9d0e"
	plain := func(name, image string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "peek", Image: image}}},
		}
	}

	for name, image := range map[string]string{
		"by tag":                 theirs,
		"by digest":              suiteCheckpoints + "/" + victim + "@sha256:9c8d7e",
		"registry in upper case": "REGISTRY.TEST/ms2m/checkpoints/" + victim + ":orders-x1",
		"with https's port":      "registry.test:443/ms2m/checkpoints/" + victim + ":orders-x1",
		"deeper below the repo":  suiteCheckpoints + "/" + victim + "/orders:1",
	} {
		t.Run("container "+name, func(t *testing.T) {
			requireDenied(t, c.Create(ctx, plain(testName(name), image)), `container "peek" has image "`+image+`"`, "checkpoint repository", "whole memory")
		})
	}
	t.Run("init container", func(t *testing.T) {
		p := plain("init", "registry.test/tools:1")
		p.Spec.InitContainers = []corev1.Container{{Name: "fetch", Image: theirs}}
		requireDenied(t, c.Create(ctx, p), `init container "fetch" has image`)
	})
	t.Run("pod labelled out of ms2m", func(t *testing.T) {
		p := plain("out", theirs)
		p.Labels = map[string]string{contract.LabelInject: "false"}
		requireDenied(t, c.Create(ctx, p), `container "peek" has image`)
	})
	t.Run("opted-in pod", func(t *testing.T) {
		p := appPod(tenant, "optedin", map[string]string{contract.AnnotationInject: "true"})
		p.Spec.Containers[0].Image = theirs
		requireDenied(t, c.Create(ctx, p), `container "app" has image`)
	})
	t.Run("look-alike repositories", func(t *testing.T) {
		for i, image := range []string{"registry.test/ms2m/checkpoints-evil/x:1", "other.test/ms2m/checkpoints/" + victim + ":1"} {
			if err := c.Create(ctx, plain("alike-"+string(rune('a'+i)), image)); err != nil {
				t.Errorf("image %s: %v, want it admitted", image, err)
			}
		}
	})

	// Updates: an image changed to a checkpoint image, and an ephemeral
	// container added with one, labelled out or not.
	for _, labels := range []map[string]string{nil, {contract.LabelInject: "false"}} {
		p := plain(testName("upd", labels[contract.LabelInject]), "registry.test/tools:1")
		p.Labels = labels
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		changed := p.DeepCopy()
		changed.Spec.Containers[0].Image = theirs
		requireDenied(t, c.Update(ctx, changed), `container "peek" has image`)
		debug := p.DeepCopy()
		debug.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "dbg", Image: theirs, TerminationMessagePolicy: corev1.TerminationMessageReadFile, ImagePullPolicy: corev1.PullIfNotPresent}}}
		requireDenied(t, c.SubResource("ephemeralcontainers").Update(ctx, debug), `ephemeral container "dbg" has image`)
		debug.Spec.EphemeralContainers[0].Image = "registry.test/tools:debug"
		if err := c.SubResource("ephemeralcontainers").Update(ctx, debug); err != nil {
			t.Errorf("an ephemeral container with an ordinary image: %v", err)
		}
	}

	// The controller's own restore runs its checkpoint image, and the
	// restored pod can be updated (labels, ms2m annotations) afterwards.
	own := inject.Migration{Name: "orders-x2", Image: suiteCheckpoints + "/" + tenant + "@sha256:2222", Node: "node-b",
		LogName: inject.DefaultLogName(tenant, "orders"), ReplayStart: "0", ReplayCutoff: "marker", ReplayEpoch: "0"}
	pod := appPod(tenant, "restored", restoreAnnotations(suiteKey, tenant, "restored", own, time.Now().Add(time.Hour)))
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("the controller's signed restore was denied: %v", err)
	}
	if pod.Spec.Containers[0].Image != own.Image {
		t.Fatalf("restored app image %q, want %q", pod.Spec.Containers[0].Image, own.Image)
	}
	pod.Labels = map[string]string{"served": "yes"}
	pod.Annotations[contract.AnnotationLogMaxAge] = "2h"
	if err := c.Update(ctx, pod); err != nil {
		t.Errorf("an update of the restored pod: %v", err)
	}
	// Its signature covers the app container only.
	two := appPod(tenant, "restored-two", restoreAnnotations(suiteKey, tenant, "restored-two", own, time.Now().Add(time.Hour)))
	two.Spec.Containers = append(two.Spec.Containers, corev1.Container{Name: "peek", Image: theirs})
	requireDenied(t, c.Create(ctx, two), `container "peek" has image`)
}

func testName(parts ...string) string {
	out := "p"
	for _, p := range parts {
		for _, r := range p {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
				out += string(r)
			case r >= 'A' && r <= 'Z':
				out += string(r - 'A' + 'a')
			default:
				out += "-"
			}
		}
	}
	return out
}
