package migrate

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// NotPlaceable is the error of a target node the pod may not run on: its
// nodeSelector, its required node affinity or a NoSchedule/NoExecute taint
// of the node (that none of the pod's tolerations tolerates) keeps it off.
// The migrator pins the target pod to the node itself, past the scheduler,
// so it checks what the scheduler would: a tenant cannot use it to place a
// pod onto a tainted or dedicated node. contract.AnnotationMigrateForce
// ("true") on the pod skips the check.
type NotPlaceable struct {
	Node   string
	Reason string // what refused it: the taint, the selector or the affinity
}

func (e *NotPlaceable) Error() string {
	return fmt.Sprintf("target node %s: %s; the scheduler would not place this pod there: pick another node, or set %s: \"true\" on the pod to migrate it anyway", e.Node, e.Reason, contract.AnnotationMigrateForce)
}

// Forced says whether pod asks to skip the placement check.
func Forced(pod *corev1.Pod) bool {
	return pod.Annotations[contract.AnnotationMigrateForce] == "true"
}

// CheckPlacement says, as a *NotPlaceable, why pod may not run on node,
// or nil if it may. Pure.
func CheckPlacement(pod *corev1.Pod, node *corev1.Node) error {
	refuse := func(format string, args ...any) error {
		return &NotPlaceable{Node: node.Name, Reason: fmt.Sprintf(format, args...)}
	}
	keys := make([]string, 0, len(pod.Spec.NodeSelector))
	for k := range pod.Spec.NodeSelector {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if v, ok := node.Labels[k]; !ok || v != pod.Spec.NodeSelector[k] {
			return refuse("the pod's nodeSelector %s=%s does not match the node's labels", k, pod.Spec.NodeSelector[k])
		}
	}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if !slices.ContainsFunc(terms, func(t corev1.NodeSelectorTerm) bool { return termMatches(t, node) }) {
			return refuse("the node matches none of the pod's required node affinity terms (requiredDuringSchedulingIgnoredDuringExecution)")
		}
	}
	for _, taint := range node.Spec.Taints {
		if taint.Effect != corev1.TaintEffectNoSchedule && taint.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if !slices.ContainsFunc(pod.Spec.Tolerations, func(tol corev1.Toleration) bool { return tolerates(tol, taint) }) {
			return refuse("taint %s, which the pod does not tolerate", taintString(taint))
		}
	}
	return nil
}

func taintString(t corev1.Taint) string {
	if t.Value == "" {
		return t.Key + ":" + string(t.Effect)
	}
	return t.Key + "=" + t.Value + ":" + string(t.Effect)
}

// tolerates says whether tol tolerates taint, as the scheduler reads it.
func tolerates(tol corev1.Toleration, taint corev1.Taint) bool {
	if tol.Effect != "" && tol.Effect != taint.Effect {
		return false
	}
	if tol.Key != "" && tol.Key != taint.Key {
		return false
	}
	switch tol.Operator {
	case corev1.TolerationOpExists:
		return true
	case corev1.TolerationOpEqual, "":
		return tol.Key != "" && tol.Value == taint.Value
	}
	return false
}

// termMatches says whether node matches every requirement of t; a term
// without requirements matches no node.
func termMatches(t corev1.NodeSelectorTerm, node *corev1.Node) bool {
	if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
		return false
	}
	for _, r := range t.MatchExpressions {
		v, has := node.Labels[r.Key]
		if !requirementHolds(r, v, has) {
			return false
		}
	}
	for _, r := range t.MatchFields {
		if r.Key != "metadata.name" || !requirementHolds(r, node.Name, true) {
			return false
		}
	}
	return true
}

func requirementHolds(r corev1.NodeSelectorRequirement, v string, has bool) bool {
	switch r.Operator {
	case corev1.NodeSelectorOpIn:
		return has && slices.Contains(r.Values, v)
	case corev1.NodeSelectorOpNotIn:
		return !has || !slices.Contains(r.Values, v)
	case corev1.NodeSelectorOpExists:
		return has
	case corev1.NodeSelectorOpDoesNotExist:
		return !has
	case corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt:
		if !has || len(r.Values) != 1 {
			return false
		}
		got, err1 := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		want, err2 := strconv.ParseInt(r.Values[0], 10, 64)
		if err1 != nil || err2 != nil {
			return false
		}
		if r.Operator == corev1.NodeSelectorOpGt {
			return got > want
		}
		return got < want
	}
	return false
}
