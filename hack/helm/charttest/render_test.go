package charttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// The release most tests render: the name a user would pick, so that the
// fullname is just "ms2m".
const (
	releaseName = "ms2m"
	releaseNS   = "ms2m-system"

	minKubeVersion = "v1.30.0"

	// testBase is under every value set the tests render, SDK and helm
	// command line alike (values given win): where checkpoint images go,
	// which the controller needs and the chart cannot make up without
	// image.registry, and the broker the controller makes each namespace's
	// broker user on (brokerUsers, on by default).
	testBase = `
migrator: {checkpointRepository: registry.example.com:5000/ms2m/checkpoints}
brokerUsers:
  managementURL: http://rabbit.example:15672
  adminSecret: {name: rabbit-admin}
  streamAddress: rabbitmq-stream://rabbit.example:5552/
`
)

// repoRoot is the repository's top folder, three levels above this file.
var repoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}()

var chartDir = filepath.Join(repoRoot, "charts", "ms2m")

// missing fails t under CI=true and skips it elsewhere, saying what is
// missing and how to get it (as internal/testenv does in the product).
func missing(t testing.TB, what, how string) {
	t.Helper()
	msg := fmt.Sprintf("\n*** MISSING: %s ***\n*** %s ***", what, how)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg + "\n*** skipping (this fails under CI=true) ***")
}

// rendered is a chart rendered for one release.
type rendered struct {
	release, namespace string
	objs               []*unstructured.Unstructured
	notes              string
}

// values parses a values file's text. A nil t panics on an error (for
// the constant testBase).
func values(t testing.TB, text string) map[string]any {
	v := map[string]any{}
	if err := sigsyaml.Unmarshal([]byte(text), &v); err != nil {
		if t == nil {
			panic(fmt.Sprintf("values %q: %v", text, err))
		}
		t.Helper()
		t.Fatalf("values %q: %v", text, err)
	}
	return v
}

// mergeValues returns base with over merged in, as helm merges two -f
// files: maps key by key, anything else replaced.
func mergeValues(base, over map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		bm, ok1 := out[k].(map[string]any)
		om, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			out[k] = mergeValues(bm, om)
			continue
		}
		out[k] = v
	}
	return out
}

// renderChart renders the chart with the Helm SDK as `helm template`
// does: client-side, with the schema checked and NOTES rendered.
func renderChart(release, ns string, vals map[string]any) (rendered, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return rendered{}, fmt.Errorf("load %s: %w", chartDir, err)
	}
	inst := action.NewInstall(action.NewConfiguration())
	inst.DryRunStrategy = action.DryRunClient
	inst.ReleaseName = release
	inst.Namespace = ns
	inst.Replace = true
	// The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion):
	// without a cluster, Helm would assume its own default.
	kv, err := common.ParseKubeVersion(minKubeVersion)
	if err != nil {
		return rendered{}, err
	}
	inst.KubeVersion = kv
	r, err := inst.Run(ch, mergeValues(values(nil, testBase), vals))
	if err != nil {
		return rendered{}, err
	}
	rel, ok := r.(*releasev1.Release)
	if !ok {
		return rendered{}, fmt.Errorf("install returned a %T", r)
	}
	objs, err := parseManifests(rel.Manifest)
	if err != nil {
		return rendered{}, err
	}
	return rendered{release: release, namespace: ns, objs: objs, notes: rel.Info.Notes}, nil
}

func render(t testing.TB, vals map[string]any) rendered {
	t.Helper()
	return renderAs(t, releaseName, releaseNS, vals)
}

func renderAs(t testing.TB, release, ns string, vals map[string]any) rendered {
	t.Helper()
	r, err := renderChart(release, ns, vals)
	if err != nil {
		t.Fatalf("render the chart as release %s in %s: %v", release, ns, err)
	}
	return r
}

// parseManifests splits a multi-document YAML stream into objects,
// skipping empty documents.
func parseManifests(s string) ([]*unstructured.Unstructured, error) {
	dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(s), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if err.Error() == "EOF" {
				return out, nil
			}
			return nil, fmt.Errorf("parse the rendered manifests: %w", err)
		}
		if len(u.Object) == 0 {
			continue
		}
		out = append(out, u)
	}
}

func (r rendered) find(kind, ns, name string) (*unstructured.Unstructured, bool) {
	for _, o := range r.objs {
		if o.GetKind() == kind && o.GetNamespace() == ns && o.GetName() == name {
			return o, true
		}
	}
	return nil, false
}

func (r rendered) get(t testing.TB, kind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	o, ok := r.find(kind, ns, name)
	if !ok {
		t.Fatalf("no %s %s/%s among the rendered objects: %v", kind, ns, name, r.names())
	}
	return o
}

func (r rendered) ofKind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func (r rendered) kinds() map[string]int {
	m := map[string]int{}
	for _, o := range r.objs {
		m[o.GetKind()]++
	}
	return m
}

func (r rendered) names() []string {
	var s []string
	for _, o := range r.objs {
		s = append(s, fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName()))
	}
	sort.Strings(s)
	return s
}

// typed decodes u into T strictly: a field T does not have fails the test,
// so a misspelt field in a template cannot pass.
func typed[T any](t testing.TB, u *unstructured.Unstructured) *T {
	t.Helper()
	b, err := json.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	out := new(T)
	if err := dec.Decode(out); err != nil {
		t.Fatalf("%s %s/%s does not decode strictly into %T: %v", u.GetKind(), u.GetNamespace(), u.GetName(), out, err)
	}
	return out
}

// badValues are the files in testdata/bad: values the chart must refuse.
// Each file's "# want: " lines are what the error must say.
type badValues struct {
	name string
	path string
	want []string
}

func readBadValues(t testing.TB) []badValues {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "bad", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/bad/*.yaml (%v)", err)
	}
	var out []badValues
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		bv := badValues{name: strings.TrimSuffix(filepath.Base(f), ".yaml"), path: f}
		for _, line := range strings.Split(string(b), "\n") {
			if w, ok := strings.CutPrefix(line, "# want: "); ok {
				bv.want = append(bv.want, w)
			}
		}
		if len(bv.want) == 0 {
			t.Fatalf("%s has no \"# want: \" line", f)
		}
		out = append(out, bv)
	}
	return out
}

func checkRefusal(t *testing.T, out string, err error, want []string) {
	t.Helper()
	if err == nil {
		t.Fatalf("the chart accepted the values; want an error saying %q", want)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("the error does not say %q:\n%s", w, out)
		}
	}
}

// TestBadValuesAreRefused renders each bad values file with the SDK, as
// `helm install` would.
func TestBadValuesAreRefused(t *testing.T) {
	for _, bv := range readBadValues(t) {
		t.Run(bv.name, func(t *testing.T) {
			b, err := os.ReadFile(bv.path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = renderChart(releaseName, releaseNS, values(t, string(b)))
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			checkRefusal(t, msg, err, bv.want)
		})
	}
}

func mustContain[S ~[]E, E comparable](t testing.TB, what string, s S, want ...E) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(s, w) {
			t.Errorf("%s is %v, want it to contain %v", what, s, w)
		}
	}
}
