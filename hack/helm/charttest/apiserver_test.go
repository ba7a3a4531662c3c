package charttest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// The test control plane: a real kube-apiserver and etcd (envtest), started
// by the first test that needs it and stopped by TestMain.
var apiserver struct {
	once    sync.Once
	env     *envtest.Environment
	cfg     *rest.Config
	missing string
	err     error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if apiserver.env != nil {
		_ = apiserver.env.Stop()
	}
	os.Exit(code)
}

// assetsDir is where kube-apiserver and etcd are: KUBEBUILDER_ASSETS (the
// Makefile sets it), else the repository's bin/k8s.
func assetsDir() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	return filepath.Join(repoRoot, "bin", "k8s")
}

// requireAPIServer returns an admin config for the test control plane.
func requireAPIServer(t testing.TB) *rest.Config {
	t.Helper()
	apiserver.once.Do(func() {
		dir := assetsDir()
		for _, b := range []string{"kube-apiserver", "etcd"} {
			if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
				apiserver.missing = fmt.Sprintf("the test control plane's %s in %s", b, dir)
				return
			}
		}
		env := &envtest.Environment{BinaryAssetsDirectory: dir}
		cfg, err := env.Start()
		if err != nil {
			_ = env.Stop()
			apiserver.err = fmt.Errorf("start envtest with the binaries in %s: %w", dir, err)
			return
		}
		apiserver.env, apiserver.cfg = env, cfg
	})
	if apiserver.missing != "" {
		missing(t, apiserver.missing, "run `make k8s-bin` (it builds kube-apiserver and etcd into bin/k8s), or set KUBEBUILDER_ASSETS")
	}
	if apiserver.err != nil {
		t.Fatal(apiserver.err)
	}
	return apiserver.cfg
}

// customKinds are the API groups of the custom resources the chart may
// render. Their CRDs (cert-manager's, the Prometheus Operator's) are not in
// the test control plane; TestCertManager decodes those objects strictly
// into their projects' Go types instead.
var customKinds = map[string]bool{"cert-manager.io": true, "monitoring.coreos.com": true}

type cluster struct {
	cs     kubernetes.Interface
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newCluster(t testing.TB, cfg *rest.Config) cluster {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cluster{cs: cs, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

func (c cluster) createNamespaces(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		_, err := c.cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create namespace %s: %v", n, err)
		}
	}
}

func (c cluster) resource(u *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := u.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if u.GetNamespace() == "" {
			return nil, fmt.Errorf("%s %s is namespaced but has no namespace", gvk.Kind, u.GetName())
		}
		return c.dyn.Resource(m.Resource).Namespace(u.GetNamespace()), nil
	}
	if u.GetNamespace() != "" {
		return nil, fmt.Errorf("%s %s is cluster-scoped but has namespace %s", gvk.Kind, u.GetName(), u.GetNamespace())
	}
	return c.dyn.Resource(m.Resource), nil
}

// applyAll applies every object (but the custom kinds) by server-side apply
// with strict field validation: an unknown or duplicate field, a wrong type
// or a value the API server's validation refuses fails the test. The
// objects are deleted at the end of the test, so that a registration whose
// webhook does not run does not block later pods.
func (c cluster) applyAll(t testing.TB, objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	t.Helper()
	ctx := t.Context()
	var applied []*unstructured.Unstructured
	for _, o := range objs {
		if customKinds[o.GroupVersionKind().Group] {
			continue
		}
		ri, err := c.resource(o)
		if err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			FieldManager: "charttest", Force: ptr(true), FieldValidation: "Strict",
		})
		if err != nil {
			t.Fatalf("the API server refused %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
		applied = append(applied, got)
		t.Cleanup(func() {
			// Not t.Context(): it has ended by the time cleanups run.
			if err := ri.Delete(context.Background(), o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		})
	}
	return applied
}

func ptr[T any](v T) *T { return &v }

// TestEveryObjectIsAccepted applies each main value combination to a real
// kube-apiserver.
func TestEveryObjectIsAccepted(t *testing.T) {
	cfg := requireAPIServer(t)
	c := newCluster(t, cfg)
	cases := []struct {
		name, release, text string
		workloads           []string
	}{
		{name: "defaults", release: "defaults"},
		{name: "cert-manager", release: "certs", text: certManagerValues},
		{name: "confined", release: "confined", text: strings.ReplaceAll(confinedValues, "[shop, jobs]", "[confined-shop, confined-jobs]"),
			workloads: []string{"confined-shop", "confined-jobs"}},
		{name: "no controller", release: "nocontroller", text: `{migrator: {controller: {enabled: false}}, brokerUsers: {provision: manual}}`},
		{name: "everything changed", release: "custom", text: `
image: {registry: registry.example.com:5000, tag: v9, pullPolicy: Always}
imagePullSecrets: [{name: regcred}]
webhook:
  failurePolicy: Ignore
  timeoutSeconds: 5
  sideEffects: None
  excludeNamespaces: [monitoring]
  namespaceSelector: {matchLabels: {ms2m.io/inject: enabled}}
  selfSigned: {validity: 720h, extraHosts: [webhook.example.com, 10.0.0.1]}
  sidecar: {image: {pullPolicy: IfNotPresent}, resources: {cpuLimit: 500m}}
  priorityClassName: system-cluster-critical
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: infra, effect: NoSchedule}]
  podAnnotations: {example.com/team: platform}
agent:
  runtimeEndpoint: unix:///var/run/crio/crio.sock
  criuLogDirs: []
  token: {existingSecret: my-agent-token, key: secret}
  priorityClassName: system-node-critical
migrator:
  checkpointRepository: ""
  controller:
    replicas: 3
    concurrentMigrations: 1
    migrationTimeout: 90s
    metricsPort: 9090
    healthPort: 9091
    logLevel: debug
    resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {cpu: "1", memory: 1Gi}}
    priorityClassName: system-cluster-critical
    nodeSelector: {kubernetes.io/os: linux}
    tolerations: [{key: dedicated, operator: Equal, value: infra, effect: NoSchedule}]
    affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app.kubernetes.io/component: controller}}}}]}}
    podAnnotations: {example.com/team: platform}
serviceMonitor: {enabled: true}
kubeletCheckpointAccess:
  enabled: true
  subjects: [{kind: Group, name: apiserver-kubelet-clients, apiGroup: rbac.authorization.k8s.io}]
`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.release + "-system"
			r := renderAs(t, tc.release, ns, values(t, tc.text))
			c.createNamespaces(t, append([]string{ns}, tc.workloads...)...)
			applied := c.applyAll(t, r.objs)
			if len(applied) == 0 {
				t.Fatal("nothing applied")
			}
			t.Logf("%d objects accepted: %s", len(applied), strings.Join(rendered{objs: applied}.names(), ", "))
		})
	}
}

// sar asks the API server whether the service account ns/name may do
// attrs.
func sar(t testing.TB, cs kubernetes.Interface, user string, groups []string, attrs authorizationv1.ResourceAttributes) bool {
	t.Helper()
	r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &attrs},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.Allowed
}

func serviceAccount(ns, name string) (string, []string) {
	return "system:serviceaccount:" + ns + ":" + name, []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
}

type access struct {
	verb, group, resource, subresource, ns, name string
}

func (a access) String() string {
	r := a.resource
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.group != "" {
		r += "." + a.group
	}
	s := a.verb + " " + r
	if a.name != "" {
		s += " " + a.name
	}
	if a.ns != "" {
		s += " in " + a.ns
	}
	return s
}

func checkAccess(t *testing.T, cs kubernetes.Interface, who, user string, groups []string, allowed, denied []access) {
	t.Helper()
	for want, list := range map[bool][]access{true: allowed, false: denied} {
		for _, a := range list {
			got := sar(t, cs, user, groups, authorizationv1.ResourceAttributes{
				Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Namespace: a.ns, Name: a.name,
			})
			if got != want {
				t.Errorf("%s may %s: %v, want %v", who, a, got, want)
			}
		}
	}
}

// TestLeastPrivilege asks the real RBAC authorizer what each identity of
// the chart may do: what the code needs is allowed, the next thing over is
// not.
func TestLeastPrivilege(t *testing.T) {
	cfg := requireAPIServer(t)
	c := newCluster(t, cfg)

	t.Run("cluster-wide", func(t *testing.T) {
		ns := "lp-system"
		r := renderAs(t, "lp", ns, values(t, `kubeletCheckpointAccess: {enabled: true}`))
		c.createNamespaces(t, ns)
		c.applyAll(t, r.objs)

		user, groups := serviceAccount(ns, "lp-ms2m-webhook")
		checkAccess(t, c.cs, "the webhook", user, groups, []access{
			{verb: "list", resource: "namespaces"},
			{verb: "watch", resource: "namespaces"},
			{verb: "get", resource: "namespaces", name: "shop"},
			{verb: "get", resource: "configmaps", ns: "shop", name: "ms2m-migration-web-0"},
			{verb: "create", group: "events.k8s.io", resource: "events", ns: "shop"},
			{verb: "patch", group: "events.k8s.io", resource: "events", ns: "shop"},
			{verb: "get", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "lp-ms2m-webhook"},
			{verb: "update", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "lp-ms2m-webhook"},
			{verb: "get", resource: "pods", ns: "shop", name: "consumer-0"},
			{verb: "patch", resource: "pods", ns: "shop", name: "consumer-0"},
			{verb: "get", resource: "nodes", name: "node-a"},
			// Each namespace's control token, which it writes.
			{verb: "get", resource: "secrets", ns: "shop", name: "ms2m-control"},
			{verb: "update", resource: "secrets", ns: "shop", name: "ms2m-control"},
			{verb: "create", resource: "secrets", ns: "shop"},
		}, []access{
			{verb: "update", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "someone-elses"},
			{verb: "delete", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "lp-ms2m-webhook"},
			{verb: "list", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations"},
			{verb: "update", resource: "namespaces", name: "shop"},
			{verb: "list", resource: "configmaps", ns: "shop"},
			{verb: "update", resource: "configmaps", ns: "shop", name: "ms2m-migration-web-0"},
			{verb: "delete", resource: "pods", ns: "shop", name: "consumer-0"},
			{verb: "list", resource: "nodes"},
			{verb: "get", resource: "secrets", ns: "shop", name: "ms2m-broker"},
			{verb: "update", resource: "secrets", ns: "shop", name: "ms2m-broker"},
			{verb: "list", resource: "secrets", ns: "shop"},
			{verb: "delete", resource: "secrets", ns: "shop", name: "ms2m-control"},
			{verb: "create", resource: "events", ns: "shop"},
		})

		user, groups = serviceAccount(ns, "lp-ms2m-migrator")
		checkAccess(t, c.cs, "the migrator", user, groups, []access{
			{verb: "get", resource: "pods", ns: "shop", name: "consumer-0"},
			{verb: "create", resource: "pods", ns: "shop"},
			{verb: "delete", resource: "pods", ns: "shop", name: "consumer-0"},
			{verb: "get", resource: "nodes", name: "node-b"},
			{verb: "patch", resource: "pods", ns: "shop", name: "consumer-0"},
			{verb: "create", resource: "configmaps", ns: "shop"},
			{verb: "delete", resource: "configmaps", ns: "shop", name: "ms2m-migration-web-0"},
		}, []access{
			// No node proxy: the kubelet's whole API (exec, run, attach)
			// on every node. The agents take the checkpoints.
			{verb: "create", resource: "nodes", subresource: "proxy", name: "node-a"},
			// Control tokens are derived from the controller's key.
			{verb: "get", resource: "secrets", ns: "shop", name: "ms2m-control"},
			{verb: "get", resource: "secrets", ns: "shop", name: "ms2m-broker"},
			{verb: "list", resource: "secrets", ns: "shop"},
			{verb: "get", resource: "secrets", ns: ns, name: "lp-ms2m-agent-token"},
			{verb: "update", resource: "pods", ns: "shop", name: "consumer-0"},
			{verb: "create", resource: "pods", subresource: "exec", ns: "shop", name: "consumer-0"},
			{verb: "list", resource: "pods", ns: "shop"},
			{verb: "update", resource: "nodes", name: "node-b"},
			{verb: "get", resource: "nodes", subresource: "proxy", name: "node-a"},
			{verb: "create", resource: "nodes", subresource: "checkpoint", name: "node-a"},
			{verb: "list", resource: "configmaps", ns: "shop"},
		})

		// The controller: the migrator's rules, plus watching pods
		// everywhere, its Events, and its lease in the release namespace.
		user, groups = serviceAccount(ns, "lp-ms2m-controller")
		checkAccess(t, c.cs, "the controller", user, groups, []access{
			{verb: "list", resource: "pods"},
			{verb: "watch", resource: "pods"},
			{verb: "get", resource: "pods", ns: "shop", name: "consumer-0"},
			{verb: "patch", resource: "pods", ns: "shop", name: "consumer-0"},
			{verb: "create", resource: "pods", ns: "shop"},
			{verb: "delete", resource: "pods", ns: "shop", name: "consumer-0-target"},
			{verb: "get", resource: "nodes", name: "node-b"},
			{verb: "create", resource: "configmaps", ns: "shop"},
			{verb: "update", resource: "configmaps", ns: "shop", name: "ms2m-migration-web-0"},
			{verb: "delete", resource: "configmaps", ns: "shop", name: "ms2m-migration-web-0"},
			{verb: "get", resource: "configmaps", ns: "shop", name: "ms2m-migration-web-0"},
			{verb: "list", resource: "configmaps"},
			{verb: "watch", resource: "configmaps"},
			{verb: "create", group: "events.k8s.io", resource: "events", ns: "shop"},
			{verb: "patch", group: "events.k8s.io", resource: "events", ns: "shop"},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", ns: ns},
			{verb: "get", group: "coordination.k8s.io", resource: "leases", ns: ns, name: "ms2m-migrator"},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", ns: ns, name: "ms2m-migrator"},
			{verb: "create", resource: "events", ns: ns},
			// Per-namespace broker users (brokerUsers, on by default).
			{verb: "list", resource: "namespaces"},
			{verb: "watch", resource: "namespaces"},
			{verb: "get", resource: "namespaces", name: "shop"},
			{verb: "create", resource: "secrets", ns: "shop"},
			{verb: "get", resource: "secrets", ns: "shop", name: "ms2m-broker-user"},
			{verb: "update", resource: "secrets", ns: "shop", name: "ms2m-broker-user"},
		}, []access{
			{verb: "get", resource: "secrets", ns: "shop", name: "someone-elses"},
			{verb: "update", resource: "secrets", ns: "shop", name: "ms2m-control"},
			{verb: "delete", resource: "secrets", ns: "shop", name: "ms2m-broker-user"},
			{verb: "update", resource: "namespaces", name: "shop"},
			{verb: "list", resource: "secrets"},
			{verb: "get", resource: "secrets", ns: "shop", name: "ms2m-control"},
			{verb: "get", resource: "secrets", ns: "shop", name: "ms2m-broker"},
			{verb: "get", resource: "secrets", ns: ns, name: "lp-ms2m-agent-token"},
			{verb: "update", resource: "pods", ns: "shop", name: "consumer-0"},
			{verb: "create", resource: "pods", subresource: "exec", ns: "shop", name: "consumer-0"},
			{verb: "get", resource: "nodes", subresource: "proxy", name: "node-a"},
			{verb: "create", resource: "nodes", subresource: "proxy", name: "node-a"},
			{verb: "create", resource: "nodes", subresource: "checkpoint", name: "node-a"},
			{verb: "list", resource: "nodes"},
			{verb: "update", resource: "nodes", name: "node-b"},
			{verb: "get", group: "apps", resource: "statefulsets", ns: "shop", name: "web"},
			{verb: "get", group: "coordination.k8s.io", resource: "leases", ns: ns, name: "someone-elses"},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", ns: "kube-system", name: "ms2m-migrator"},
			{verb: "delete", group: "coordination.k8s.io", resource: "leases", ns: ns, name: "ms2m-migrator"},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", ns: "shop"},
			{verb: "create", resource: "events", ns: "shop"},
		})
		// The migration Jobs' identity does not gain the controller's
		// rules.
		user, groups = serviceAccount(ns, "lp-ms2m-migrator")
		checkAccess(t, c.cs, "the migrator", user, groups, nil, []access{
			{verb: "watch", resource: "pods"},
			{verb: "create", group: "events.k8s.io", resource: "events", ns: "shop"},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", ns: ns, name: "ms2m-migrator"},
		})

		// The agent: its kubelet's /checkpoint, nothing else of the
		// kubelet's API, nothing of the API server's.
		user, groups = serviceAccount(ns, "lp-ms2m-agent")
		checkAccess(t, c.cs, "the agent", user, groups, []access{
			{verb: "create", resource: "nodes", subresource: "checkpoint", name: "node-a"},
		}, []access{
			{verb: "create", resource: "nodes", subresource: "proxy", name: "node-a"},
			{verb: "get", resource: "nodes", subresource: "proxy", name: "node-a"},
			{verb: "get", resource: "nodes", subresource: "log", name: "node-a"},
			{verb: "get", resource: "nodes", subresource: "stats", name: "node-a"},
			{verb: "get", resource: "pods", ns: "shop"},
			{verb: "get", resource: "nodes", name: "node-a"},
			{verb: "get", resource: "secrets", ns: ns, name: "lp-ms2m-agent-token"},
			{verb: "get", resource: "secrets", ns: ns, name: "lp-ms2m-agent-tls"},
		})

		checkAccess(t, c.cs, "the API server's kubelet client", "kube-apiserver-kubelet-client", []string{"system:authenticated"}, []access{
			{verb: "create", resource: "nodes", subresource: "checkpoint", name: "node-a"},
		}, []access{
			{verb: "create", resource: "nodes", subresource: "proxy", name: "node-a"},
		})
	})

	// A caller with the migrator's rules (a migration Job's pod, say)
	// asks the API server's node proxy for the kubelet's /run (exec in a
	// pod): refused by RBAC, before any kubelet is called. With the
	// fallback migrator.checkpointVia: apiserver it would be let through,
	// which is why that fallback is opt-in.
	t.Run("no exec through the node proxy", func(t *testing.T) {
		for _, tc := range []struct {
			release, via string
			wantCode     int
		}{
			{"px", "agent", http.StatusForbidden},
			{"pxa", "apiserver", 0}, // allowed: fails later, at the missing node
		} {
			ns := tc.release + "-system"
			r := renderAs(t, tc.release, ns, values(t, "migrator: {checkpointVia: "+tc.via+"}"))
			c.createNamespaces(t, ns)
			c.applyAll(t, r.objs)
			as := rest.CopyConfig(cfg)
			user, groups := serviceAccount(ns, tc.release+"-ms2m-migrator")
			as.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
			cs, err := kubernetes.NewForConfig(as)
			if err != nil {
				t.Fatal(err)
			}
			var code int
			err = cs.CoreV1().RESTClient().Post().AbsPath("/api/v1/nodes/node-a/proxy/run/shop/consumer-0/app").
				Param("cmd", "cat /etc/hostname").Do(t.Context()).StatusCode(&code).Error()
			if tc.wantCode != 0 {
				if code != tc.wantCode || !apierrors.IsForbidden(err) {
					t.Errorf("checkpointVia %s: the migrator's POST .../proxy/run: %d %v, want %d Forbidden", tc.via, code, err, tc.wantCode)
				}
				continue
			}
			if apierrors.IsForbidden(err) {
				t.Errorf("checkpointVia %s: the migrator's POST .../proxy/run was forbidden (%v): the fallback lost its nodes/proxy", tc.via, err)
			}
			au, ag := serviceAccount(ns, tc.release+"-ms2m-agent")
			if sar(t, c.cs, au, ag, authorizationv1.ResourceAttributes{Verb: "create", Resource: "nodes", Subresource: "checkpoint", Name: "node-a"}) {
				t.Errorf("checkpointVia %s: the agent may still create nodes/checkpoint", tc.via)
			}
		}
	})

	t.Run("confined", func(t *testing.T) {
		ns := "lpc-system"
		r := renderAs(t, "lpc", ns, values(t, `workloadNamespaces: [lpc-shop]`))
		c.createNamespaces(t, ns, "lpc-shop")
		c.applyAll(t, r.objs)

		user, groups := serviceAccount(ns, "lpc-ms2m-migrator")
		checkAccess(t, c.cs, "the confined migrator", user, groups, []access{
			{verb: "create", resource: "pods", ns: "lpc-shop"},
		}, []access{
			{verb: "create", resource: "nodes", subresource: "proxy", name: "node-a"},
			{verb: "create", resource: "pods", ns: "default"},
			{verb: "get", resource: "secrets", ns: "lpc-shop", name: "ms2m-control"},
		})
		user, groups = serviceAccount(ns, "lpc-ms2m-controller")
		checkAccess(t, c.cs, "the confined controller", user, groups, []access{
			{verb: "watch", resource: "pods"},
			{verb: "patch", resource: "pods", ns: "lpc-shop", name: "consumer-0"},
			{verb: "create", group: "events.k8s.io", resource: "events", ns: "lpc-shop"},
		}, []access{
			{verb: "patch", resource: "pods", ns: "default", name: "consumer-0"},
			{verb: "get", resource: "pods", ns: "default", name: "consumer-0"},
			{verb: "create", group: "events.k8s.io", resource: "events", ns: "default"},
			{verb: "get", resource: "secrets", ns: "lpc-shop", name: "ms2m-control"},
		})
		user, groups = serviceAccount(ns, "lpc-ms2m-webhook")
		checkAccess(t, c.cs, "the confined webhook", user, groups, []access{
			{verb: "get", resource: "configmaps", ns: "lpc-shop", name: "ms2m-migration-web-0"},
			{verb: "list", resource: "namespaces"},
			{verb: "update", resource: "secrets", ns: "lpc-shop", name: "ms2m-control"},
			{verb: "create", resource: "secrets", ns: "lpc-shop"},
		}, []access{
			{verb: "create", resource: "secrets", ns: "default"},
			{verb: "update", resource: "secrets", ns: "default", name: "ms2m-control"},
			{verb: "get", resource: "configmaps", ns: "default", name: "ms2m-migration-web-0"},
			{verb: "create", group: "events.k8s.io", resource: "events", ns: "default"},
		})
		checkAccess(t, c.cs, "the API server's kubelet client (binding off)", "kube-apiserver-kubelet-client", []string{"system:authenticated"}, nil, []access{
			{verb: "create", resource: "nodes", subresource: "checkpoint", name: "node-a"},
		})
	})
}

// waitFor polls cond until it is true or the deadline passes.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, last)
}
