package webhook

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// Pods opt in so that they fail closed with the label contract.LabelInject:
// a pod labelled ms2m.io/inject=true (beside its annotation
// ms2m.io/inject: "true", which is what injects it) is not created while
// the webhook is down. "false" keeps the webhook from injecting the pod;
// it still checks the pod's images. Namespaces opt in by the label contract.LabelNamespaceInject
// with the value "enabled".

// The webhooks of the configuration that Registration builds. Each pod
// CREATE goes to exactly one of the first four, each UPDATE to the
// fifth, each eviction to the sixth.
const (
	// WebhookNamespace: CREATE in a namespace labelled
	// ms2m.io/inject=enabled. Failure policy Fail (Registration's).
	WebhookNamespace = "namespace.pods.ms2m.io"
	// WebhookLabel: CREATE of a pod labelled ms2m.io/inject=true in any
	// other namespace. Failure policy Fail (Registration's).
	WebhookLabel = "label.pods.ms2m.io"
	// WebhookPods: CREATE of every other pod (opted in by annotation only,
	// or not at all). Failure policy Ignore: a webhook that is down never
	// stops the cluster's other pods.
	WebhookPods = "pods.ms2m.io"
	// WebhookLabelledOut: CREATE of a pod labelled ms2m.io/inject=false,
	// anywhere. The handler does not inject it, but denies its checkpoint
	// images. Failure policy Ignore.
	WebhookLabelledOut = "labelled-out.pods.ms2m.io"
	// WebhookUpdates: UPDATE of every pod and of its ephemeral containers,
	// which the handler only validates (ms2m annotations, checkpoint
	// images). Failure policy Ignore: a webhook that is down never blocks
	// a pod's controllers (finalizers, labels) anywhere.
	WebhookUpdates = "updates.pods.ms2m.io"
	// WebhookEvictions: CREATE of pods/eviction, which the handler turns
	// into a migration for pods opted in by ms2m.io/on-evict (a 429
	// refusal, as a PodDisruptionBudget's). Failure policy Ignore: a
	// webhook that is down never blocks a drain; the pods it would have
	// migrated are evicted plainly then. No object selector: the API
	// server matches it against the Eviction, which has no labels of the
	// pod, so the handler reads the pod itself.
	WebhookEvictions = "evictions.pods.ms2m.io"
)

// Registration describes how the API server calls the webhook. Its
// Configuration is the one MutatingWebhookConfiguration of ms2m: the
// chart's template renders the same (its tests compare it with
// testdata/registration-*.golden.yaml, which this package's tests write
// from Configuration), and the e2e lab and simcluster register through it.
type Registration struct {
	// Name is the MutatingWebhookConfiguration's.
	Name string
	// ClientConfig is where the webhook is served (a Service or a URL); the
	// caBundle may be left to the self-signed bootstrap or cert-manager.
	ClientConfig admissionregistrationv1.WebhookClientConfig
	// ExcludeNamespaces are never sent to the webhook: kube-system and the
	// webhook's own namespace belong here.
	ExcludeNamespaces []string
	// Namespaces, when not empty, are the only namespaces sent.
	Namespaces []string
	// NamespaceSelector and ObjectSelector are more requirements, added to
	// each webhook's own.
	NamespaceSelector metav1.LabelSelector
	ObjectSelector    metav1.LabelSelector
	// FailurePolicy of the two webhooks for opted-in pods. Default Fail.
	FailurePolicy admissionregistrationv1.FailurePolicyType
	// SideEffects of every webhook. Default NoneOnDryRun: its Events are
	// its only side effect, and dry runs emit none.
	SideEffects admissionregistrationv1.SideEffectClass
	// TimeoutSeconds of every webhook. Default 10.
	TimeoutSeconds int32
}

// Configuration is the MutatingWebhookConfiguration of r.
func (r Registration) Configuration() *admissionregistrationv1.MutatingWebhookConfiguration {
	failure := r.FailurePolicy
	if failure == "" {
		failure = admissionregistrationv1.Fail
	}
	sideEffects := r.SideEffects
	if sideEffects == "" {
		sideEffects = admissionregistrationv1.SideEffectClassNoneOnDryRun
	}
	timeout := r.TimeoutSeconds
	if timeout == 0 {
		timeout = 10
	}
	const nsEnabled = "enabled"
	nsOptedIn := metav1.LabelSelectorRequirement{Key: contract.LabelNamespaceInject, Operator: metav1.LabelSelectorOpIn, Values: []string{nsEnabled}}
	nsNotOptedIn := metav1.LabelSelectorRequirement{Key: contract.LabelNamespaceInject, Operator: metav1.LabelSelectorOpNotIn, Values: []string{nsEnabled}}
	podNotOut := metav1.LabelSelectorRequirement{Key: contract.LabelInject, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"false"}}
	podIn := metav1.LabelSelectorRequirement{Key: contract.LabelInject, Operator: metav1.LabelSelectorOpIn, Values: []string{"true"}}
	podUnlabelled := metav1.LabelSelectorRequirement{Key: contract.LabelInject, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"true", "false"}}
	podOut := metav1.LabelSelectorRequirement{Key: contract.LabelInject, Operator: metav1.LabelSelectorOpIn, Values: []string{"false"}}

	hook := func(name string, op admissionregistrationv1.OperationType, policy admissionregistrationv1.FailurePolicyType, ns, obj metav1.LabelSelectorRequirement) admissionregistrationv1.MutatingWebhook {
		return admissionregistrationv1.MutatingWebhook{
			Name:         name,
			ClientConfig: *r.ClientConfig.DeepCopy(),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{op},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"},
					Scope: ptr(admissionregistrationv1.NamespacedScope),
				},
			}},
			NamespaceSelector:       r.namespaceSelector(ns),
			ObjectSelector:          withRequirement(r.ObjectSelector, obj),
			FailurePolicy:           ptr(policy),
			MatchPolicy:             ptr(admissionregistrationv1.Equivalent),
			SideEffects:             ptr(sideEffects),
			TimeoutSeconds:          ptr(timeout),
			AdmissionReviewVersions: []string{"v1"},
			// Another webhook that adds a container after this one runs
			// again through it; injection is idempotent.
			ReinvocationPolicy: ptr(admissionregistrationv1.IfNeededReinvocationPolicy),
		}
	}
	create, update := admissionregistrationv1.Create, admissionregistrationv1.Update
	ignore := admissionregistrationv1.Ignore
	// Every pod's updates, labelled out or not, and the ephemeral
	// containers added to it: an image can change there.
	updates := hook(WebhookUpdates, update, ignore, metav1.LabelSelectorRequirement{}, metav1.LabelSelectorRequirement{})
	updates.Rules[0].Resources = []string{"pods", "pods/ephemeralcontainers"}
	updates.ReinvocationPolicy = ptr(admissionregistrationv1.NeverReinvocationPolicy) // it never mutates
	evictions := hook(WebhookEvictions, create, ignore, metav1.LabelSelectorRequirement{}, metav1.LabelSelectorRequirement{})
	evictions.Rules[0].Resources = []string{"pods/eviction"}
	evictions.ObjectSelector = &metav1.LabelSelector{}
	evictions.ReinvocationPolicy = ptr(admissionregistrationv1.NeverReinvocationPolicy) // it never mutates
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: r.Name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			hook(WebhookNamespace, create, failure, nsOptedIn, podNotOut),
			hook(WebhookLabel, create, failure, nsNotOptedIn, podIn),
			hook(WebhookPods, create, ignore, nsNotOptedIn, podUnlabelled),
			hook(WebhookLabelledOut, create, ignore, metav1.LabelSelectorRequirement{}, podOut),
			updates,
			evictions,
		},
	}
}

// namespaceSelector is own (if it has a key) first, then the exclusions,
// the confinement and r's own requirements.
func (r Registration) namespaceSelector(own metav1.LabelSelectorRequirement) *metav1.LabelSelector {
	const nameLabel = "kubernetes.io/metadata.name"
	s := metav1.LabelSelector{}
	if len(r.NamespaceSelector.MatchLabels) > 0 {
		s.MatchLabels = map[string]string{}
		for k, v := range r.NamespaceSelector.MatchLabels {
			s.MatchLabels[k] = v
		}
	}
	if own.Key != "" {
		s.MatchExpressions = append(s.MatchExpressions, own)
	}
	if len(r.ExcludeNamespaces) > 0 {
		s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: nameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: append([]string(nil), r.ExcludeNamespaces...)})
	}
	if len(r.Namespaces) > 0 {
		s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: nameLabel, Operator: metav1.LabelSelectorOpIn, Values: append([]string(nil), r.Namespaces...)})
	}
	for _, e := range r.NamespaceSelector.MatchExpressions {
		s.MatchExpressions = append(s.MatchExpressions, *e.DeepCopy())
	}
	return &s
}

// withRequirement is sel with own (if it has a key) first among its
// expressions.
func withRequirement(sel metav1.LabelSelector, own metav1.LabelSelectorRequirement) *metav1.LabelSelector {
	s := sel.DeepCopy()
	if own.Key != "" {
		s.MatchExpressions = append([]metav1.LabelSelectorRequirement{own}, s.MatchExpressions...)
	}
	if len(s.MatchLabels) == 0 {
		s.MatchLabels = nil
	}
	return s
}

func ptr[T any](v T) *T { return &v }
