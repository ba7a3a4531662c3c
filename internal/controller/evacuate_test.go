package controller

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

func TestPlaceholder(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	zone := corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}
	gpu := corev1.NodeSelectorRequirement{Key: "gpu", Operator: corev1.NodeSelectorOpExists}
	notHere := corev1.NodeSelectorRequirement{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"node-1"}}
	req := func(cpu, mem string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}
	}
	for _, tc := range []struct {
		name      string
		affinity  *corev1.Affinity
		wantTerms []corev1.NodeSelectorTerm
	}{
		{"no affinity", nil, []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{notHere}}}},
		{"two terms, each kept off the node", &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{zone}}, {MatchExpressions: []corev1.NodeSelectorRequirement{gpu}}},
		}}}, []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{zone, notHere}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{gpu, notHere}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "consumer-0", Namespace: "shop", UID: "u-1", Labels: map[string]string{"app": "consumer"}},
				Spec: corev1.PodSpec{
					NodeName:       "node-1",
					NodeSelector:   map[string]string{"disk": "ssd"},
					Affinity:       tc.affinity,
					Tolerations:    []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
					Containers:     []corev1.Container{{Name: "app", Resources: req("500m", "256Mi")}},
					InitContainers: []corev1.Container{{Name: "ms2m-sidecar", RestartPolicy: &always, Resources: req("100m", "64Mi")}, {Name: "setup", Resources: req("2", "1Gi")}},
				},
			}
			before := src.DeepCopy()
			p := Placeholder(src, "")
			if diff := cmp.Diff(before, src); diff != "" {
				t.Errorf("the source changed (-before +after):\n%s", diff)
			}
			if got := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms; !cmp.Equal(tc.wantTerms, got) {
				t.Errorf("node selector terms (-want +got):\n%s", cmp.Diff(tc.wantTerms, got))
			}
			r := p.Spec.Containers[0].Resources.Requests
			if cpu, mem := r[corev1.ResourceCPU], r[corev1.ResourceMemory]; cpu.String() != "600m" || mem.String() != "320Mi" {
				t.Errorf("requests cpu %s memory %s, want 600m and 320Mi (app + sidecar; a run-to-completion init container needs no room beside them)", cpu.String(), mem.String())
			}
			if p.Name != PlaceholderName("u-1") || p.Labels[contract.LabelPlaceholderFor] != "u-1" || p.Labels[contract.LabelInject] != "false" || p.Labels["app"] != "" {
				t.Errorf("placeholder name %s labels %v: want its own name and labels, none of the source's", p.Name, p.Labels)
			}
			if len(p.OwnerReferences) != 1 || p.OwnerReferences[0].UID != "u-1" {
				t.Errorf("owner references %+v, want the source", p.OwnerReferences)
			}
			if !cmp.Equal(p.Spec.NodeSelector, src.Spec.NodeSelector) || !cmp.Equal(p.Spec.Tolerations, src.Spec.Tolerations) || p.Spec.NodeName != "" {
				t.Errorf("placeholder spec %+v does not carry the source's node selector and tolerations, unbound", p.Spec)
			}
			if p.Spec.Containers[0].Image != DefaultPlaceholderImage {
				t.Errorf("image %s, want %s", p.Spec.Containers[0].Image, DefaultPlaceholderImage)
			}
		})
	}
}
