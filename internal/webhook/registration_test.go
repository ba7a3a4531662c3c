package webhook

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/ms2m/ms2m/internal/contract"
)

var update = flag.Bool("update", false, "rewrite testdata/registration-*.golden.yaml from Registration")

// chartRegistrations are the chart's registrations for its default values
// and for workloadNamespaces [shop, jobs], release ms2m in ms2m-system:
// hack/helm/charttest renders the chart with those values and compares its
// MutatingWebhookConfiguration with these goldens.
func chartRegistrations() map[string]Registration {
	path := Path
	port := int32(443)
	base := Registration{
		Name: "ms2m-webhook",
		ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
			Name: "ms2m-webhook", Namespace: "ms2m-system", Path: &path, Port: &port}},
		ExcludeNamespaces: []string{"kube-system", "ms2m-system"},
	}
	confined := base
	confined.Namespaces = []string{"shop", "jobs"}
	return map[string]Registration{"default": base, "confined": confined}
}

// TestRegistrationGoldens pins the configuration: the chart's tests hold
// the chart's template to these files.
func TestRegistrationGoldens(t *testing.T) {
	for name, r := range chartRegistrations() {
		t.Run(name, func(t *testing.T) {
			got, err := yaml.Marshal(r.Configuration())
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join("testdata", "registration-"+name+".golden.yaml")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (go test ./internal/webhook -run TestRegistrationGoldens -update writes it)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("%s (-want +got):\n%s", file, diff)
			}
		})
	}
}

// TestRegistrationRouting: each pod CREATE goes to exactly one webhook,
// with Fail only where the pod opted in by a label (its namespace's or its
// own), pods labelled ms2m.io/inject=false to an Ignore webhook that only
// checks their images; each UPDATE goes to the Ignore webhook; excluded
// namespaces go nowhere.
func TestRegistrationRouting(t *testing.T) {
	cfg := Registration{Name: "x", ExcludeNamespaces: []string{"kube-system", "ms2m-system"}}.Configuration()
	type route struct {
		Webhook string
		Policy  admissionregistrationv1.FailurePolicyType
	}
	routes := func(op admissionregistrationv1.OperationType, resource, ns, nsLabel, podLabel string) []route {
		nsLabels := k8slabels.Set{"kubernetes.io/metadata.name": ns}
		if nsLabel != "" {
			nsLabels[contract.LabelNamespaceInject] = nsLabel
		}
		podLabels := k8slabels.Set{"app": "consumer"}
		if podLabel != "" {
			podLabels[contract.LabelInject] = podLabel
		}
		var got []route
		for _, w := range cfg.Webhooks {
			if w.Rules[0].Operations[0] != op || w.Rules[0].Resources[0] != resource {
				continue
			}
			nsSel, _ := metav1.LabelSelectorAsSelector(w.NamespaceSelector)
			objSel, _ := metav1.LabelSelectorAsSelector(w.ObjectSelector)
			if nsSel.Matches(nsLabels) && objSel.Matches(podLabels) {
				got = append(got, route{w.Name, *w.FailurePolicy})
			}
		}
		return got
	}
	const create, update = admissionregistrationv1.Create, admissionregistrationv1.Update
	fail, ignore := admissionregistrationv1.Fail, admissionregistrationv1.Ignore
	for _, tc := range []struct {
		name                  string
		op                    admissionregistrationv1.OperationType
		resource              string
		ns, nsLabel, podLabel string
		want                  []route
	}{
		{"namespace opted in", create, "pods", "shop", "enabled", "", []route{{WebhookNamespace, fail}}},
		{"namespace opted in, pod labelled too", create, "pods", "shop", "enabled", "true", []route{{WebhookNamespace, fail}}},
		{"namespace opted in, pod labelled out", create, "pods", "shop", "enabled", "false", []route{{WebhookLabelledOut, ignore}}},
		{"pod labelled in", create, "pods", "default", "", "true", []route{{WebhookLabel, fail}}},
		{"pod labelled in, namespace label not enabled", create, "pods", "default", "disabled", "true", []route{{WebhookLabel, fail}}},
		{"nothing opted in (annotation only, or none)", create, "pods", "default", "", "", []route{{WebhookPods, ignore}}},
		{"pod labelled out", create, "pods", "default", "", "false", []route{{WebhookLabelledOut, ignore}}},
		{"system namespace", create, "pods", "kube-system", "enabled", "true", nil},
		{"webhook's namespace", create, "pods", "ms2m-system", "", "", nil},
		{"update in an opted-in namespace", update, "pods", "shop", "enabled", "true", []route{{WebhookUpdates, ignore}}},
		{"update elsewhere", update, "pods", "default", "", "", []route{{WebhookUpdates, ignore}}},
		{"update of a pod labelled out", update, "pods", "default", "", "false", []route{{WebhookUpdates, ignore}}},
		// An eviction's object selector sees the Eviction (no labels), and
		// the handler reads the pod: every namespace but the excluded.
		{"eviction", create, "pods/eviction", "default", "", "", []route{{WebhookEvictions, ignore}}},
		{"eviction in an opted-in namespace", create, "pods/eviction", "shop", "enabled", "", []route{{WebhookEvictions, ignore}}},
		{"eviction in the webhook's namespace", create, "pods/eviction", "ms2m-system", "", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, routes(tc.op, tc.resource, tc.ns, tc.nsLabel, tc.podLabel)); diff != "" {
				t.Errorf("webhooks called (-want +got):\n%s", diff)
			}
		})
	}
}
