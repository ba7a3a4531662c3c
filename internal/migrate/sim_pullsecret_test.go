package migrate_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/internal/contract"
)

// TestPrePullWithThePodsPullSecret: the controller migrates a
// Deployment's pod that names a pull Secret for its image's registry
// (beside one that is missing, and a Secret of the same name in another
// namespace with other credentials): the target node's agent is asked to
// pull the app's image with the credentials of the pod's own Secret, in
// the pod's namespace.
func TestPrePullWithThePodsPullSecret(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	ctx := t.Context()
	const ns, other = "sim-pullsecret", "sim-pullsecret-other"
	secret := func(namespace, user string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: namespace}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: fmt.Appendf(nil, `{"auths":{"sim.test":{"username":%q,"password":"pw-%s"}}}`, user, user)}}
	}
	if err := c.Namespace(ctx, other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client.CoreV1().Namespaces().Delete(ctx, other, metav1.DeleteOptions{}) })
	if _, err := c.Client.CoreV1().Secrets(other).Create(ctx, secret(other, "elsewhere"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tmpl := podTemplate(true)
	tmpl.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "not-there"}, {Name: "regcred"}}
	w := deployWith(t, c, ns, "Deployment", tmpl, func() {
		if _, err := c.Client.CoreV1().Secrets(ns).Create(ctx, secret(ns, "puller"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	startController(t, c, "the controller", c.Kubeconfig)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, contract.AnnotationMigrateTo, nodeB)
	if _, err := c.Client.CoreV1().Pods(ns).Patch(ctx, w.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitMigrated(t, c, ns, w.pod, nodeB, "")

	pulls, auths := c.Nodes[nodeB].Pulls(), c.Nodes[nodeB].PullAuths()
	var found bool
	for i, ref := range pulls {
		if !strings.HasPrefix(ref, "sim.test/") {
			continue
		}
		found = true
		if a := auths[i]; a == nil || a.Registry != "sim.test" || a.Username != "puller" || a.Password != "pw-puller" {
			t.Errorf("the target pulled %s with %v, want the pod's own Secret's credentials", ref, a)
		}
	}
	if !found {
		t.Errorf("the target pulled %v, not the app's image", pulls)
	}
	if got := c.Nodes[nodeA].PullAuths(); len(got) != 0 {
		t.Errorf("the source node was asked to pull: %v", c.Nodes[nodeA].Pulls())
	}
}
