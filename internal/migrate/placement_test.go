package migrate

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCheckPlacement: the target node is held to the pod's nodeSelector,
// its required node affinity and the node's NoSchedule/NoExecute taints,
// as the scheduler would; on the old behaviour every case below passed.
func TestCheckPlacement(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a", "gpu": "yes", "cores": "8"}}}
	tainted := func(taints ...corev1.Taint) *corev1.Node {
		n := node.DeepCopy()
		n.Spec.Taints = taints
		return n
	}
	dedicated := corev1.Taint{Key: "dedicated", Value: "team-b", Effect: corev1.TaintEffectNoSchedule}
	noExec := corev1.Taint{Key: "maint", Effect: corev1.TaintEffectNoExecute}
	prefer := corev1.Taint{Key: "soft", Effect: corev1.TaintEffectPreferNoSchedule}
	affinity := func(terms ...corev1.NodeSelectorTerm) *corev1.Affinity {
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
	}
	expr := func(key string, op corev1.NodeSelectorOperator, vals ...string) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: op, Values: vals}}}
	}
	for _, tc := range []struct {
		name string
		spec corev1.PodSpec
		node *corev1.Node
		want string // "" for allowed, else a part of the reason
	}{
		{name: "plain pod, plain node", node: node},
		{name: "nodeSelector matches", spec: corev1.PodSpec{NodeSelector: map[string]string{"zone": "a"}}, node: node},
		{name: "nodeSelector does not match", spec: corev1.PodSpec{NodeSelector: map[string]string{"zone": "b"}}, node: node, want: "nodeSelector zone=b"},
		{name: "nodeSelector key missing", spec: corev1.PodSpec{NodeSelector: map[string]string{"disk": "ssd"}}, node: node, want: "nodeSelector disk=ssd"},
		{name: "affinity In matches", spec: corev1.PodSpec{Affinity: affinity(expr("zone", corev1.NodeSelectorOpIn, "a", "b"))}, node: node},
		{name: "affinity In fails", spec: corev1.PodSpec{Affinity: affinity(expr("zone", corev1.NodeSelectorOpIn, "c"))}, node: node, want: "required node affinity"},
		{name: "affinity second term matches", spec: corev1.PodSpec{Affinity: affinity(expr("zone", corev1.NodeSelectorOpIn, "c"), expr("gpu", corev1.NodeSelectorOpExists))}, node: node},
		{name: "affinity NotIn", spec: corev1.PodSpec{Affinity: affinity(expr("zone", corev1.NodeSelectorOpNotIn, "a"))}, node: node, want: "required node affinity"},
		{name: "affinity DoesNotExist", spec: corev1.PodSpec{Affinity: affinity(expr("gpu", corev1.NodeSelectorOpDoesNotExist))}, node: node, want: "required node affinity"},
		{name: "affinity Gt", spec: corev1.PodSpec{Affinity: affinity(expr("cores", corev1.NodeSelectorOpGt, "4"))}, node: node},
		{name: "affinity Lt fails", spec: corev1.PodSpec{Affinity: affinity(expr("cores", corev1.NodeSelectorOpLt, "4"))}, node: node, want: "required node affinity"},
		{name: "affinity by name", spec: corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n2"}}}})}, node: node, want: "required node affinity"},
		{name: "affinity empty term matches nothing", spec: corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorTerm{})}, node: node, want: "required node affinity"},
		{name: "NoSchedule taint, no toleration", node: tainted(dedicated), want: "taint dedicated=team-b:NoSchedule"},
		{name: "NoExecute taint, no toleration", node: tainted(noExec), want: "taint maint:NoExecute"},
		{name: "PreferNoSchedule taint is no bar", node: tainted(prefer)},
		{name: "tolerated by Equal", spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "team-b", Effect: corev1.TaintEffectNoSchedule}}}, node: tainted(dedicated)},
		{name: "Equal with another value", spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: "dedicated", Value: "team-a"}}}, node: tainted(dedicated), want: "taint dedicated=team-b:NoSchedule"},
		{name: "tolerated by Exists on the key", spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}}, node: tainted(dedicated)},
		{name: "tolerated by Exists on everything", spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}, node: tainted(dedicated, noExec)},
		{name: "toleration of another effect", spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: "maint", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}}, node: tainted(noExec), want: "taint maint:NoExecute"},
		{name: "one of two taints tolerated", spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: "maint", Operator: corev1.TolerationOpExists}}}, node: tainted(noExec, dedicated), want: "taint dedicated=team-b:NoSchedule"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: tc.spec}
			err := CheckPlacement(pod, tc.node)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("CheckPlacement: %v, want allowed", err)
				}
				return
			}
			var np *NotPlaceable
			if !errors.As(err, &np) {
				t.Fatalf("CheckPlacement: %v, want a *NotPlaceable saying %q", err, tc.want)
			}
			if diff := cmp.Diff(tc.node.Name, np.Node); diff != "" {
				t.Errorf("node (-want +got):\n%s", diff)
			}
			for _, part := range []string{tc.want, "target node n1", "ms2m.io/migrate-force: \"true\""} {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("message %q does not say %q", err, part)
				}
			}
		})
	}
}
