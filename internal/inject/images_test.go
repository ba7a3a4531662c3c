package inject

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestCheckpointImageNames: every way of writing a reference that the
// runtime reads as a name in the checkpoint repository is one; look-alikes
// are not.
func TestCheckpointImageNames(t *testing.T) {
	for repo, cases := range map[string]map[string]bool{
		"registry.example.com:5000/ms2m/checkpoints": {
			"registry.example.com:5000/ms2m/checkpoints/shop:m1-abc":        true,
			"registry.example.com:5000/ms2m/checkpoints/shop@sha256:0011":   true,
			"registry.example.com:5000/ms2m/checkpoints/shop:t@sha256:0011": true,
			"REGISTRY.Example.COM:5000/ms2m/checkpoints/shop:t":             true,
			"registry.example.com:5000/MS2M/Checkpoints/shop:t":             true,
			"registry.example.com:5000/ms2m/checkpoints:t":                  true,
			"registry.example.com:5000/ms2m/checkpoints/a/b/c:t":            true,
			"registry.example.com:5000/ms2m/checkpoints-evil/shop:t":        false,
			"registry.example.com:5000/ms2m/checkpointsshop:t":              false,
			"registry.example.com/ms2m/checkpoints/shop:t":                  false,
			"registry.example.com:5001/ms2m/checkpoints/shop:t":             false,
			"ms2m/checkpoints/shop:t":                                       false,
		},
		"docker.io/acme/ckpt": {
			"acme/ckpt/shop:1":                 true,
			"docker.io/acme/ckpt/shop:1":       true,
			"index.docker.io/acme/ckpt/shop:1": true,
			"Docker.IO/acme/ckpt/shop:1":       true,
			"acme/ckpt-x/shop:1":               false,
			"quay.io/acme/ckpt/shop:1":         false,
		},
		"ckpt": { // docker.io/library/ckpt
			"ckpt:1":                     true,
			"library/ckpt:1":             true,
			"docker.io/library/ckpt/x:1": true,
			"localhost/ckpt:1":           false,
			"localhost:5000/ckpt:1":      false,
		},
		"localhost:5000/ckpt": {
			"localhost:5000/ckpt/shop:1":  true,
			"LOCALHOST:5000/ckpt/shop:1":  true,
			"localhost/ckpt/shop:1":       false,
			"localhost:5000/ckpt2/shop:1": false,
		},
		"registry.example.com:443/ckpt": {
			"registry.example.com/ckpt/shop:1":     true,
			"registry.example.com:443/ckpt/shop:1": true,
		},
	} {
		cfg := Config{CheckpointRepository: repo}
		for image, want := range cases {
			pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: image}}}}
			err := CheckImages(pod, nil, cfg, nil)
			if got := err != nil; got != want {
				t.Errorf("repository %s, image %s: denied %v (%v), want %v", repo, image, got, err, want)
			}
			if err != nil && !strings.Contains(err.Error(), `container "app" has image "`+image+`"`) {
				t.Errorf("repository %s, image %s: message %q does not name the container and image", repo, image, err)
			}
		}
	}
	for _, bad := range []string{"reg.example.com/ckpt:tag", "reg.example.com/ckpt@sha256:00", "reg example/ckpt"} {
		if err := (Config{CheckpointRepository: bad}).Validate(); err == nil || !strings.Contains(err.Error(), "checkpointRepository") {
			t.Errorf("checkpoint repository %q: %v, want it refused", bad, err)
		}
	}
}

// TestCheckImagesOnUpdate: an image a container already had is not checked
// again (a restored pod keeps its checkpoint image through every update),
// a changed one is, and so is an ephemeral container added later.
func TestCheckImagesOnUpdate(t *testing.T) {
	cfg := Config{CheckpointRepository: "reg.test/ckpt"}
	restored := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "app", Image: "reg.test/ckpt/shop@sha256:01"}, {Name: "side", Image: "reg.test/tools:1"}}}}
	if err := CheckImages(restored.DeepCopy(), restored, cfg, nil); err != nil {
		t.Errorf("an update that keeps the restored image: %v", err)
	}
	swapped := restored.DeepCopy()
	swapped.Spec.Containers[1].Image = "reg.test/ckpt/other@sha256:02"
	if err := CheckImages(swapped, restored, cfg, nil); err == nil || !strings.Contains(err.Error(), `container "side"`) {
		t.Errorf("an update that sets a checkpoint image: %v, want it denied", err)
	}
	debug := restored.DeepCopy()
	debug.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "dbg", Image: "reg.test/ckpt/shop@sha256:01"}}}
	if err := CheckImages(debug, restored, cfg, nil); err == nil || !strings.Contains(err.Error(), `ephemeral container "dbg"`) {
		t.Errorf("an ephemeral container with a checkpoint image: %v, want it denied", err)
	}
	// The verified restore allows its image in the app container only.
	m := &Migration{Image: "reg.test/ckpt/shop@sha256:01"}
	if err := CheckImages(restored, nil, cfg, m); err != nil {
		t.Errorf("the restore's own image: %v", err)
	}
	other := restored.DeepCopy()
	other.Spec.Containers[0].Image = "reg.test/ckpt/shop@sha256:99"
	if err := CheckImages(other, nil, cfg, m); err == nil {
		t.Error("an app image other than the restore's: admitted, want it denied")
	}
}
