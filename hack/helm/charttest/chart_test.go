package charttest

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/ms2m/ms2m/internal/contract"
)

// The main value combinations the tests render.
const (
	certManagerValues = `
certManager: {enabled: true}
serviceMonitor: {enabled: true}
`
	confinedValues = `
workloadNamespaces: [shop, jobs]
secrets:
  create: true
kubeletCheckpointAccess: {enabled: true}
agent:
  registry: {insecure: true, authSecret: regcred}
`
)

func envMap(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

// envIndex is the position of variable name in c's environment, or -1.
func envIndex(c corev1.Container, name string) int {
	for i, e := range c.Env {
		if e.Name == name {
			return i
		}
	}
	return -1
}

func webhookDeployment(t *testing.T, r rendered) *appsv1.Deployment {
	t.Helper()
	return typed[appsv1.Deployment](t, r.get(t, "Deployment", r.namespace, "ms2m-webhook"))
}

func TestDefaults(t *testing.T) {
	r := render(t, nil)

	wantKinds := map[string]int{
		"ServiceAccount": 4, "Secret": 3, "ClusterRole": 7, "ClusterRoleBinding": 7, "Role": 1, "RoleBinding": 1,
		"Service": 2, "Deployment": 2, "DaemonSet": 1, "MutatingWebhookConfiguration": 1,
	}
	if diff := cmp.Diff(wantKinds, r.kinds()); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}
	for _, o := range r.objs {
		if o.GetLabels()["app.kubernetes.io/part-of"] != "ms2m" || o.GetLabels()["app.kubernetes.io/instance"] != releaseName {
			t.Errorf("%s %s lacks the chart's labels: %v", o.GetKind(), o.GetName(), o.GetLabels())
		}
	}

	// The self-signed bootstrap: one replica, its certificate in an
	// emptyDir, and the names it needs pointing at this release's objects.
	d := webhookDeployment(t, r)
	if got := *d.Spec.Replicas; got != 1 {
		t.Errorf("webhook replicas = %d, want 1 with the self-signed bootstrap", got)
	}
	c := d.Spec.Template.Spec.Containers[0]
	env := envMap(c)
	for k, want := range map[string]string{
		"MS2M_WEBHOOK_SELF_SIGNED":              "true",
		"MS2M_WEBHOOK_SERVICE_NAME":             "ms2m-webhook",
		"MS2M_WEBHOOK_CONFIG_NAME":              "ms2m-webhook",
		"MS2M_WEBHOOK_SIDECAR_IMAGE":            "ms2m/sidecar:0.1.0",
		"MS2M_WEBHOOK_BROKER_USERS":             "true",
		"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET":     "ms2m-control",
		"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET_KEY": "control-token",
		"MS2M_WEBHOOK_LOG_MAX_BYTES":            "1073741824",
		"MS2M_WEBHOOK_PORT":                     "9443",
	} {
		if got := env[k].Value; got != want {
			t.Errorf("webhook env %s = %q, want %q", k, got, want)
		}
	}
	// Per-namespace broker users: no shared stream URI reaches the webhook.
	for _, k := range []string{"MS2M_WEBHOOK_STREAM_URI_SECRET", "MS2M_WEBHOOK_STREAM_URI_SECRET_KEY"} {
		if _, ok := env[k]; ok {
			t.Errorf("webhook env sets %s beside MS2M_WEBHOOK_BROKER_USERS", k)
		}
	}
	if f := env["MS2M_WEBHOOK_SERVICE_NAMESPACE"].ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("MS2M_WEBHOOK_SERVICE_NAMESPACE = %+v, want the pod's metadata.namespace", env["MS2M_WEBHOOK_SERVICE_NAMESPACE"])
	}
	if c.Image != "ms2m/webhook:0.1.0" {
		t.Errorf("webhook image = %q", c.Image)
	}
	vol := d.Spec.Template.Spec.Volumes[0]
	if vol.EmptyDir == nil || c.VolumeMounts[0].MountPath != env["MS2M_WEBHOOK_CERT_DIR"].Value {
		t.Errorf("the self-signed certificate goes to an emptyDir at MS2M_WEBHOOK_CERT_DIR; got volume %+v mounted at %q, cert dir %q",
			vol, c.VolumeMounts[0].MountPath, env["MS2M_WEBHOOK_CERT_DIR"].Value)
	}
	checkRestricted(t, "webhook", d.Spec.Template.Spec, c)
	checkSigningKey(t, r, "webhook", d.Spec.Template.Spec, c, "MS2M_WEBHOOK_SIGNING_KEY_FILE")

	// The registration: the Service it calls is the one that selects the
	// webhook's pods, on the port the container serves.
	mwc := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, r.get(t, "MutatingWebhookConfiguration", "", "ms2m-webhook"))
	checkRegistration(t, r, mwc, d)
	checkPinned(t, mwc, "default")
	wh := mwc.Webhooks[0]
	if *wh.FailurePolicy != admissionregistrationv1.Fail || *wh.SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun ||
		*wh.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy || *wh.TimeoutSeconds != 10 {
		t.Errorf("webhook policies: failure %s, side effects %s, reinvocation %s, timeout %d", *wh.FailurePolicy, *wh.SideEffects, *wh.ReinvocationPolicy, *wh.TimeoutSeconds)
	}
	if mwc.Annotations["cert-manager.io/inject-ca-from"] != "" {
		t.Errorf("self-signed: no cert-manager annotation, got %q", mwc.Annotations["cert-manager.io/inject-ca-from"])
	}

	// Least privilege, rule by rule.
	checkRules(t, r, "ms2m-webhook", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"}, ResourceNames: []string{"ms2m-webhook"}, Verbs: []string{"get", "update"}},
	})
	checkRules(t, r, "ms2m-webhook-workloads", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		// Each namespace's own control token, which it writes.
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"ms2m-control"}, Verbs: []string{"get", "update"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
	})
	// The migrator reads nodes, and has no other right on them: no
	// nodes/proxy (the kubelet's whole API, exec into any pod, on every
	// node). The source node's agent takes the checkpoint.
	checkRules(t, r, "ms2m-migrator", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
	})
	// The agent: create on nodes/checkpoint, which its own node's kubelet
	// checks for POST /checkpoint/... (webhook authorization), and nothing
	// else, of the kubelet's API or the API server's.
	checkRules(t, r, "ms2m-agent", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes/checkpoint"}, Verbs: []string{"create"}},
	})
	ab := typed[rbacv1.ClusterRoleBinding](t, r.get(t, "ClusterRoleBinding", "", "ms2m-agent"))
	if ab.RoleRef.Name != "ms2m-agent" || !cmp.Equal(subjectNames(ab.Subjects), []string{"ms2m-agent"}) {
		t.Errorf("ClusterRoleBinding ms2m-agent: %+v %+v, want ClusterRole ms2m-agent for the agent's ServiceAccount alone", ab.RoleRef, ab.Subjects)
	}
	checkRules(t, r, "ms2m-migrator-workloads", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "create", "delete", "patch"}},
		// The condition ms2m.io/StateNotRebuilt of a pod whose state the
		// controller could not rebuild.
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "update", "delete"}},
		// No Secret: control tokens are derived from the controller's key.
	})
	// The controller: what one migration needs through the migrator's
	// bindings, and only watching pods and pending-migration records, its
	// Events and the lease besides.
	// With per-namespace broker users made by the controller (the
	// default), it also watches namespaces (which to give a user, and
	// when one is deleted) and writes the one Secret ms2m-broker-user.
	checkRules(t, r, "ms2m-controller", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
	})
	checkRules(t, r, "ms2m-controller-workloads", []rbacv1.PolicyRule{
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}},
		{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"ms2m-broker-user"}, Verbs: []string{"get", "update"}},
	})
	role := typed[rbacv1.Role](t, r.get(t, "Role", releaseNS, "ms2m-controller-leader-election"))
	if diff := cmp.Diff([]rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"ms2m-migrator"}, Verbs: []string{"get", "update"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}, role.Rules); diff != "" {
		t.Errorf("Role ms2m-controller-leader-election rules (-want +got):\n%s", diff)
	}
	rb := typed[rbacv1.RoleBinding](t, r.get(t, "RoleBinding", releaseNS, "ms2m-controller-leader-election"))
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != "ms2m-controller" {
		t.Errorf("RoleBinding ms2m-controller-leader-election: %+v %+v", rb.RoleRef, rb.Subjects)
	}

	// Not confined: the namespaced roles are bound cluster-wide. The
	// migrator's bindings hold the controller too.
	for name, subjects := range map[string][]string{
		"ms2m-webhook": {"ms2m-webhook"}, "ms2m-webhook-workloads": {"ms2m-webhook"},
		"ms2m-migrator": {"ms2m-migrator", "ms2m-controller"}, "ms2m-migrator-workloads": {"ms2m-migrator", "ms2m-controller"},
		"ms2m-controller": {"ms2m-controller"}, "ms2m-controller-workloads": {"ms2m-controller"},
	} {
		b := typed[rbacv1.ClusterRoleBinding](t, r.get(t, "ClusterRoleBinding", "", name))
		if b.RoleRef.Name != name || !cmp.Equal(subjectNames(b.Subjects), subjects) {
			t.Errorf("ClusterRoleBinding %s: roleRef %s, subjects %+v, want %v in %s", name, b.RoleRef.Name, b.Subjects, subjects, releaseNS)
		}
	}

	checkAgent(t, r)
	checkController(t, r, "ms2m", "registry.example.com:5000/ms2m/checkpoints")

	for _, want := range []string{contract.AnnotationMigrateTo + "=<node>", "migrator status <namespace>/<pod>", "get events",
		"rollout status deployment/ms2m-controller", "get lease ms2m-migrator", "serviceAccountName: ms2m-migrator"} {
		if !strings.Contains(r.notes, want) {
			t.Errorf("NOTES must say how to trigger and follow a migration (%q):\n%s", want, r.notes)
		}
	}
}

// subjectNames lists the names of ServiceAccount subjects in the release
// namespace, and anything else in full.
func subjectNames(subjects []rbacv1.Subject) []string {
	var out []string
	for _, s := range subjects {
		if s.Kind == "ServiceAccount" && s.Namespace == releaseNS {
			out = append(out, s.Name)
		} else {
			out = append(out, s.Kind+" "+s.Namespace+"/"+s.Name)
		}
	}
	return out
}

// checkController checks the migrator controller: its configuration,
// consistent with the agent DaemonSet it calls, the agents' token from the
// same Secret, probes on the health port, a Service for its metrics, and
// the restricted security level.
func checkController(t *testing.T, r rendered, fullname, wantRepo string) {
	t.Helper()
	d := typed[appsv1.Deployment](t, r.get(t, "Deployment", r.namespace, fullname+"-controller"))
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	if !cmp.Equal(c.Args, []string{"controller"}) {
		t.Errorf("controller args = %v, want [controller]", c.Args)
	}
	if *d.Spec.Replicas != 2 {
		t.Errorf("controller replicas = %d, want 2", *d.Spec.Replicas)
	}
	if spec.ServiceAccountName != fullname+"-controller" {
		t.Errorf("controller ServiceAccount = %q", spec.ServiceAccountName)
	}
	checkRestricted(t, "controller", spec, c)
	checkSigningKey(t, r, "controller", spec, c, "MS2M_STATUS_KEY_FILE")

	// Every variable `migrator controller` reads (docs/migrator.md):
	// set, or on purpose left at its default (MS2M_AGENT_TOKEN: the
	// token comes as a file).
	env := envMap(c)
	ds := typed[appsv1.DaemonSet](t, r.get(t, "DaemonSet", r.namespace, fullname+"-agent"))
	agentPort := strconv.Itoa(int(ds.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort))
	want := map[string]string{
		"MS2M_IMAGE_REPO":                wantRepo,
		"MS2M_AGENT_PORT":                agentPort,
		"MS2M_AGENT_TOKEN_FILE":          "/etc/ms2m/agent-token/token",
		"MS2M_AGENT_CA_FILE":             "/etc/ms2m/agent-ca/ca.crt",
		"MS2M_AGENT_SERVER_NAME":         fullname + "-agent." + r.namespace,
		"MS2M_CHECKPOINT_VIA":            "agent",
		"MS2M_STATUS_KEY_FILE":           "/etc/ms2m/status-key/key",
		"MS2M_LEADER_ELECTION":           "true",
		"MS2M_LEADER_ELECTION_NAMESPACE": r.namespace,
		"MS2M_CONCURRENT_MIGRATIONS":     "4",
		"MS2M_EVACUATE_PER_NODE":         "2",
		"MS2M_EVACUATE_MAX":              "4",
		"MS2M_PLACEHOLDER_IMAGE":         "registry.k8s.io/pause:3.10",
		"MS2M_MIGRATION_TIMEOUT":         "5m",
		"MS2M_THAW_AFTER_DUMP":           "auto",
		"MS2M_METRICS_ADDR":              ":8080",
		"MS2M_HEALTH_ADDR":               ":8081",
		"MS2M_LOG_LEVEL":                 "info",
		// Per-namespace broker users (testBase's brokerUsers).
		"MS2M_BROKER_MANAGEMENT_URL":      "http://rabbit.example:15672",
		"MS2M_BROKER_ADMIN_USERNAME_FILE": "/etc/ms2m/broker-admin/username",
		"MS2M_BROKER_ADMIN_PASSWORD_FILE": "/etc/ms2m/broker-admin/password",
		"MS2M_BROKER_STREAM_ADDRESS":      "rabbitmq-stream://rabbit.example:5552/",
		"MS2M_BROKER_USER_PREFIX":         "ms2m-ns.",
	}
	// The namespaces given a broker user are those the controller's
	// workload RoleBindings are in, when confined.
	var bound []string
	for _, o := range r.ofKind("RoleBinding") {
		if o.GetName() == fullname+"-controller" {
			bound = append(bound, o.GetNamespace())
		}
	}
	if len(bound) > 0 {
		want["MS2M_BROKER_USER_NAMESPACES"] = strings.Join(bound, ",")
	}
	got := map[string]string{}
	for k, e := range env {
		got[k] = e.Value
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("controller env (-want +got):\n%s", diff)
	}

	// The agents' token: the Secret key the DaemonSet mounts.
	secrets := map[string]*corev1.SecretVolumeSource{}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = v.Secret
		}
	}
	var tv *corev1.SecretVolumeSource
	for _, m := range c.VolumeMounts {
		if m.MountPath == filepath.Dir(env["MS2M_AGENT_TOKEN_FILE"].Value) {
			tv = secrets[m.Name]
		}
	}
	var agentTV *corev1.SecretVolumeSource
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "token" {
			agentTV = v.Secret
		}
	}
	if tv == nil || agentTV == nil || tv.SecretName != agentTV.SecretName || len(tv.Items) != 1 ||
		tv.Items[0].Key != agentTV.Items[0].Key || tv.Items[0].Path != filepath.Base(env["MS2M_AGENT_TOKEN_FILE"].Value) {
		t.Errorf("MS2M_AGENT_TOKEN_FILE is not the agent DaemonSet's token Secret key: controller %+v, agent %+v", tv, agentTV)
	}

	// The broker administrator: brokerUsers.adminSecret's two keys, as
	// the files the variables name.
	var admin *corev1.SecretVolumeSource
	for _, m := range c.VolumeMounts {
		if m.MountPath == filepath.Dir(env["MS2M_BROKER_ADMIN_USERNAME_FILE"].Value) {
			admin = secrets[m.Name]
		}
	}
	if admin == nil || admin.SecretName != "rabbit-admin" || !cmp.Equal(admin.Items, []corev1.KeyToPath{{Key: "username", Path: "username"}, {Key: "password", Path: "password"}}) {
		t.Errorf("the broker administrator's Secret as mounted: %+v", admin)
	}

	// Probes on the port of MS2M_HEALTH_ADDR; /metrics behind a Service.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for probe, path := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != path || ":"+strconv.Itoa(int(ports[probe.HTTPGet.Port.StrVal])) != env["MS2M_HEALTH_ADDR"].Value {
			t.Errorf("probe %+v: want GET %s on the port of MS2M_HEALTH_ADDR=%s", probe, path, env["MS2M_HEALTH_ADDR"].Value)
		}
	}
	svc := typed[corev1.Service](t, r.get(t, "Service", r.namespace, fullname+"-controller"))
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("Service %s selects %v, which the controller pods' labels %v do not match", svc.Name, svc.Spec.Selector, d.Spec.Template.Labels)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || ":"+strconv.Itoa(int(ports[svc.Spec.Ports[0].TargetPort.StrVal])) != env["MS2M_METRICS_ADDR"].Value {
		t.Errorf("Service %s ports %+v: want metrics, to the port of MS2M_METRICS_ADDR=%s", svc.Name, svc.Spec.Ports, env["MS2M_METRICS_ADDR"].Value)
	}
}

// checkSigningKey checks that container c of spec reads the controller's
// signing key (the Secret ms2m-migration-status-key, which the chart
// makes) from the file its variable names: the controller signs statuses
// and restore instructions with it, the webhook checks restores with it.
func checkSigningKey(t *testing.T, r rendered, what string, spec corev1.PodSpec, c corev1.Container, variable string) {
	t.Helper()
	file := envMap(c)[variable].Value
	var vol string
	for _, m := range c.VolumeMounts {
		if m.MountPath == filepath.Dir(file) {
			vol = m.Name
		}
	}
	var secret string
	for _, v := range spec.Volumes {
		if v.Name == vol && v.Secret != nil && len(v.Secret.Items) == 0 {
			secret = v.Secret.SecretName
		}
	}
	if file == "" || filepath.Base(file) != "key" || secret != "ms2m-migration-status-key" {
		t.Errorf("%s: %s=%q is not key of the mounted Secret ms2m-migration-status-key (volume %q, Secret %q)", what, variable, file, vol, secret)
	}
	if _, ok := r.find("Secret", r.namespace, "ms2m-migration-status-key"); !ok {
		t.Errorf("%s reads Secret ms2m-migration-status-key, which the chart does not make", what)
	}
}

// TestControllerDisabled: no controller, nothing of its RBAC, and the
// checkpoint repository is then needed only for the printed Job.
func TestControllerDisabled(t *testing.T) {
	r := render(t, values(t, `{migrator: {checkpointRepository: "", controller: {enabled: false}}, brokerUsers: {provision: manual}}`))
	for _, o := range r.objs {
		if strings.Contains(o.GetName(), "controller") || o.GetLabels()["app.kubernetes.io/component"] == "controller" {
			t.Errorf("%s %s rendered with migrator.controller.enabled=false", o.GetKind(), o.GetName())
		}
	}
	for _, name := range []string{"ms2m-migrator", "ms2m-migrator-workloads"} {
		b := typed[rbacv1.ClusterRoleBinding](t, r.get(t, "ClusterRoleBinding", "", name))
		if !cmp.Equal(subjectNames(b.Subjects), []string{"ms2m-migrator"}) {
			t.Errorf("ClusterRoleBinding %s subjects = %+v, want only the migrator", name, b.Subjects)
		}
	}
	for _, want := range []string{"no migrator controller", "serviceAccountName: ms2m-migrator", "--image-repo, <registry>/ms2m/checkpoints"} {
		if !strings.Contains(r.notes, want) {
			t.Errorf("NOTES must say that there is no controller and how to run a migration as the migrator (%q):\n%s", want, r.notes)
		}
	}
}

// checkRestricted checks what every ms2m container that is not the agent
// keeps to: the Pod Security "restricted" level.
func checkRestricted(t *testing.T, what string, spec corev1.PodSpec, c corev1.Container) {
	t.Helper()
	psc, sc := spec.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s pod security context %+v: want runAsNonRoot and the RuntimeDefault seccomp profile", what, psc)
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !cmp.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("%s container security context %+v: want no privilege escalation, a read-only root and all capabilities dropped", what, sc)
	}
}

func checkRegistration(t *testing.T, r rendered, mwc *admissionregistrationv1.MutatingWebhookConfiguration, d *appsv1.Deployment) {
	t.Helper()
	if len(mwc.Webhooks) != 6 {
		t.Fatalf("%d webhooks, want 6 (namespace, label, pods, labelled-out, updates, evictions)", len(mwc.Webhooks))
	}
	for _, wh := range mwc.Webhooks {
		ref := wh.ClientConfig.Service
		if ref == nil || ref.Path == nil || *ref.Path != "/mutate-v1-pod" || ref.Namespace != r.namespace {
			t.Fatalf("webhook %s: clientConfig.service = %+v, want the webhook Service's /mutate-v1-pod", wh.Name, ref)
		}
		svc := typed[corev1.Service](t, r.get(t, "Service", ref.Namespace, ref.Name))
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("Service %s selects %v, which the webhook pods' labels %v do not match", svc.Name, svc.Spec.Selector, d.Spec.Template.Labels)
		}
		var target string
		for _, p := range svc.Spec.Ports {
			if p.Port == *ref.Port {
				target = p.TargetPort.StrVal
			}
		}
		env := envMap(d.Spec.Template.Spec.Containers[0])
		found := false
		for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
			if p.Name == target && p.ContainerPort > 0 && env["MS2M_WEBHOOK_PORT"].Value == strconv.Itoa(int(p.ContainerPort)) {
				found = true
			}
		}
		if !found {
			t.Errorf("Service port %d targets %q, which is not the container port MS2M_WEBHOOK_PORT=%s", *ref.Port, target, env["MS2M_WEBHOOK_PORT"].Value)
		}
		want := []string{"pods"}
		switch {
		case wh.Name == "evictions.pods.ms2m.io":
			want = []string{"pods/eviction"}
		case wh.Rules[0].Operations[0] == admissionregistrationv1.Update:
			// An image can change by an update and by an added
			// ephemeral container: no checkpoint image either way.
			want = []string{"pods", "pods/ephemeralcontainers"}
		}
		if len(wh.Rules) != 1 || !cmp.Equal(wh.Rules[0].Resources, want) {
			t.Errorf("webhook %s: rules = %+v, want %v", wh.Name, wh.Rules, want)
		}
	}

	// Where each pod goes: never the system's nor the webhook's own
	// namespace; a pod that opted in by its namespace's label or its own
	// to one webhook with the chart's failurePolicy; every other pod (one
	// labelled ms2m.io/inject=false too, whose images are checked), and
	// every UPDATE, to one that ignores failures, so that a webhook that
	// is down stops nothing else.
	fail := admissionregistrationv1.Fail
	for _, tc := range []struct {
		op            admissionregistrationv1.OperationType
		ns            labels.Set
		pod           labels.Set
		want          int
		wantIgnoreAll bool
	}{
		{"CREATE", labels.Set{"kubernetes.io/metadata.name": "kube-system", contract.LabelNamespaceInject: "enabled"}, labels.Set{contract.LabelInject: "true"}, 0, false},
		{"CREATE", labels.Set{"kubernetes.io/metadata.name": r.namespace}, labels.Set{}, 0, false},
		{"UPDATE", labels.Set{"kubernetes.io/metadata.name": r.namespace}, labels.Set{}, 0, false},
		{"CREATE", labels.Set{"kubernetes.io/metadata.name": "shop", contract.LabelNamespaceInject: "enabled"}, labels.Set{contract.LabelInject: "false"}, 1, true},
		{"UPDATE", labels.Set{"kubernetes.io/metadata.name": "shop"}, labels.Set{contract.LabelInject: "false"}, 1, true},
		{"CREATE", labels.Set{"kubernetes.io/metadata.name": "shop", contract.LabelNamespaceInject: "enabled"}, labels.Set{"app": "consumer"}, 1, false},
		{"CREATE", labels.Set{"kubernetes.io/metadata.name": "shop"}, labels.Set{contract.LabelInject: "true"}, 1, false},
		{"CREATE", labels.Set{"kubernetes.io/metadata.name": "shop"}, labels.Set{"app": "consumer"}, 1, true},
		{"CREATE", labels.Set{"kubernetes.io/metadata.name": "shop"}, labels.Set{}, 1, true},
		{"UPDATE", labels.Set{"kubernetes.io/metadata.name": "shop", contract.LabelNamespaceInject: "enabled"}, labels.Set{contract.LabelInject: "true"}, 1, true},
	} {
		var called []admissionregistrationv1.MutatingWebhook
		for _, wh := range mwc.Webhooks {
			nsSel, err1 := metav1.LabelSelectorAsSelector(wh.NamespaceSelector)
			objSel, err2 := metav1.LabelSelectorAsSelector(wh.ObjectSelector)
			if err1 != nil || err2 != nil {
				t.Fatalf("webhook %s: selectors %v %v", wh.Name, err1, err2)
			}
			if wh.Rules[0].Resources[0] == "pods" && slices.Contains(wh.Rules[0].Operations, tc.op) && nsSel.Matches(tc.ns) && objSel.Matches(tc.pod) {
				called = append(called, wh)
			}
		}
		if len(called) != tc.want {
			t.Errorf("%s of a pod labelled %v in a namespace labelled %v: %d webhooks called, want %d", tc.op, tc.pod, tc.ns, len(called), tc.want)
			continue
		}
		for _, wh := range called {
			if tc.wantIgnoreAll && *wh.FailurePolicy == fail {
				t.Errorf("%s of a pod labelled %v in a namespace labelled %v: webhook %s fails closed; a pod that did not opt in by label must not wait on the webhook", tc.op, tc.pod, tc.ns, wh.Name)
			}
		}
	}
}

// checkPinned holds the chart's MutatingWebhookConfiguration to
// internal/webhook's Registration for the same values: its golden file
// testdata/registration-<name>.golden.yaml, which that package's tests
// write from the builder that the e2e lab and simcluster register with.
func checkPinned(t *testing.T, mwc *admissionregistrationv1.MutatingWebhookConfiguration, name string) {
	t.Helper()
	file := filepath.Join(repoRoot, "internal", "webhook", "testdata", "registration-"+name+".golden.yaml")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := sigsyaml.UnmarshalStrict(b, want); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if want.Name != mwc.Name {
		t.Errorf("name %q, want %q (%s)", mwc.Name, want.Name, file)
	}
	if diff := cmp.Diff(want.Webhooks, mwc.Webhooks); diff != "" {
		t.Errorf("the chart's webhooks differ from internal/webhook's Registration (%s) (-want +got):\n%s", file, diff)
	}
}

func checkRules(t *testing.T, r rendered, name string, want []rbacv1.PolicyRule) {
	t.Helper()
	cr := typed[rbacv1.ClusterRole](t, r.get(t, "ClusterRole", "", name))
	if diff := cmp.Diff(want, cr.Rules); diff != "" {
		t.Errorf("ClusterRole %s rules (-want +got):\n%s", name, diff)
	}
}

// checkAgent checks the node agent: on the host network, unprivileged with
// no capabilities, every host folder read-only, its ServiceAccount token
// mounted for its kubelet only when it takes checkpoints, TLS from the
// agents' Secret, and its configuration pointing at what is mounted.
func checkAgent(t *testing.T, r rendered) {
	t.Helper()
	ds := typed[appsv1.DaemonSet](t, r.get(t, "DaemonSet", r.namespace, "ms2m-agent"))
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("the agent must be on the host network: the migrator calls it at the node's InternalIP")
	}
	_, takesCheckpoints := r.find("ClusterRole", "", "ms2m-agent")
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken != takesCheckpoints {
		t.Errorf("the agent's token mounted: %v, want %v (only for its kubelet's /checkpoint)", spec.AutomountServiceAccountToken, takesCheckpoints)
	}
	sa := typed[corev1.ServiceAccount](t, r.get(t, "ServiceAccount", r.namespace, spec.ServiceAccountName))
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount %s must not automount its token", sa.Name)
	}
	c := spec.Containers[0]
	if !cmp.Equal(c.Args, []string{"agent"}) {
		t.Errorf("agent args = %v, want [agent]", c.Args)
	}
	// On the host network, it listens on the node's address only, not on
	// every host interface.
	if ip := envMap(c)["MS2M_AGENT_LISTEN_IP"]; ip.ValueFrom == nil || ip.ValueFrom.FieldRef == nil || ip.ValueFrom.FieldRef.FieldPath != "status.hostIP" {
		t.Errorf("MS2M_AGENT_LISTEN_IP = %+v, want the node's address (fieldRef status.hostIP)", ip)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
		!cmp.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("agent security context %+v: want unprivileged, no escalation, read-only root, all capabilities dropped, none added", sc)
	}
	hostPaths := map[string]*corev1.HostPathVolumeSource{}
	secrets := map[string]*corev1.SecretVolumeSource{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath
		}
		if v.Secret != nil {
			secrets[v.Name] = v.Secret
		}
	}
	mounted := map[string]string{} // mount path -> volume
	for _, m := range c.VolumeMounts {
		mounted[m.MountPath] = m.Name
		if hp := hostPaths[m.Name]; hp != nil {
			// The one exception: the agent removes each checkpoint archive
			// once pushed (it is the process's memory), unless they are kept.
			keep := envMap(c)["MS2M_AGENT_KEEP_ARCHIVES"].Value == "true"
			if !m.ReadOnly && (m.Name != "checkpoints" || keep) {
				t.Errorf("host folder %s is mounted read-write", hp.Path)
			}
			if m.Name == "checkpoints" && m.ReadOnly && !keep {
				t.Errorf("the checkpoint folder %s is read-only, but MS2M_AGENT_KEEP_ARCHIVES is not true: the agent cannot remove pushed archives", hp.Path)
			}
			if hp.Path != m.MountPath {
				t.Errorf("host folder %s is mounted at %s: the kubelet and the runtime report host paths, so it must be at the same path", hp.Path, m.MountPath)
			}
		}
	}
	env := envMap(c)
	if i := envIndex(c, "NODE_NAME"); i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil ||
		c.Env[i].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("the agent has no NODE_NAME from spec.nodeName")
	}
	// hostDir is the host folder mounted at path, or at the folder above
	// its first segment that names $(NODE_NAME), which only expands in
	// the environment (and only after NODE_NAME).
	hostDir := func(name, path string) *corev1.HostPathVolumeSource {
		if strings.Contains(path, "$(NODE_NAME)") && envIndex(c, name) < envIndex(c, "NODE_NAME") {
			t.Errorf("%s=%s names $(NODE_NAME) before NODE_NAME is defined", name, path)
		}
		before, _, _ := strings.Cut(path, "$(NODE_NAME)")
		if before != path {
			path = filepath.Dir(before)
		}
		return hostPaths[mounted[path]]
	}
	dir := env["MS2M_AGENT_CHECKPOINT_DIR"].Value
	if hp := hostDir("MS2M_AGENT_CHECKPOINT_DIR", dir); hp == nil || *hp.Type != corev1.HostPathDirectory {
		t.Errorf("MS2M_AGENT_CHECKPOINT_DIR=%s is not a host folder of type Directory mounted there", dir)
	}
	sock := strings.TrimPrefix(env["MS2M_AGENT_RUNTIME_ENDPOINT"].Value, "unix://")
	if hostDir("MS2M_AGENT_RUNTIME_ENDPOINT", filepath.Dir(sock)) == nil {
		t.Errorf("the CRI socket %s's folder is not mounted from the host", sock)
	}
	for _, d := range strings.Split(env["MS2M_AGENT_LOG_DIRS"].Value, ",") {
		if d != "" && hostDir("MS2M_AGENT_LOG_DIRS", d) == nil {
			t.Errorf("CRIU log folder %s (MS2M_AGENT_LOG_DIRS) is not mounted from the host", d)
		}
	}
	// The agent pushes to and deletes from the controller's repository,
	// and no other.
	if o, ok := r.find("Deployment", r.namespace, "ms2m-controller"); ok {
		cd := typed[appsv1.Deployment](t, o)
		want := envMap(cd.Spec.Template.Spec.Containers[0])["MS2M_IMAGE_REPO"].Value
		if got := env["MS2M_AGENT_IMAGE_REPO"].Value; got != want || got == "" {
			t.Errorf("MS2M_AGENT_IMAGE_REPO = %q, want the controller's MS2M_IMAGE_REPO %q", got, want)
		}
	}
	tokenFile := env["MS2M_AGENT_TOKEN_FILE"].Value
	tv := secrets[mounted[filepath.Dir(tokenFile)]]
	if tv == nil || len(tv.Items) != 1 || tv.Items[0].Path != filepath.Base(tokenFile) {
		t.Fatalf("MS2M_AGENT_TOKEN_FILE=%s is not a mounted Secret key", tokenFile)
	}
	if s, ok := r.find("Secret", r.namespace, tv.SecretName); ok {
		sec := typed[corev1.Secret](t, s)
		if len(sec.Data[tv.Items[0].Key]) < 32 {
			t.Errorf("the agent token in Secret %s is %d bytes, want a random one of at least 32", sec.Name, len(sec.Data[tv.Items[0].Key]))
		}
	}
	// TLS: the certificate and key of the agents' Secret, which the
	// controller checks against its ca.crt; the probes speak TLS.
	cert, key := env["MS2M_AGENT_TLS_CERT_FILE"].Value, env["MS2M_AGENT_TLS_KEY_FILE"].Value
	tlsVol := secrets[mounted[filepath.Dir(cert)]]
	if cert == "" || key == "" || tlsVol == nil || filepath.Dir(cert) != filepath.Dir(key) ||
		!cmp.Equal(tlsVol.Items, []corev1.KeyToPath{{Key: "tls.crt", Path: filepath.Base(cert)}, {Key: "tls.key", Path: filepath.Base(key)}}) {
		t.Errorf("MS2M_AGENT_TLS_CERT_FILE=%s, MS2M_AGENT_TLS_KEY_FILE=%s: want tls.crt and tls.key of a mounted Secret, got %+v", cert, key, tlsVol)
	} else if s, ok := r.find("Secret", r.namespace, tlsVol.SecretName); ok {
		checkAgentCertificate(t, typed[corev1.Secret](t, s), "ms2m-agent."+r.namespace)
	}
	if env["MS2M_AGENT_PLAIN_HTTP"].Value != "" {
		t.Errorf("MS2M_AGENT_PLAIN_HTTP=%s: the agent serves TLS only", env["MS2M_AGENT_PLAIN_HTTP"].Value)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("probe %+v: want HTTPS", p)
		}
	}
	if takesCheckpoints {
		if got := env["MS2M_AGENT_KUBELET_URL"].Value; got != "https://$(MS2M_AGENT_LISTEN_IP):10250" || envIndex(c, "MS2M_AGENT_KUBELET_URL") < envIndex(c, "MS2M_AGENT_LISTEN_IP") {
			t.Errorf("MS2M_AGENT_KUBELET_URL = %q: want its own node's kubelet, https://$(MS2M_AGENT_LISTEN_IP):10250, after MS2M_AGENT_LISTEN_IP", got)
		}
		if env["MS2M_AGENT_KUBELET_INSECURE_SKIP_VERIFY"].Value != "false" {
			t.Errorf("MS2M_AGENT_KUBELET_INSECURE_SKIP_VERIFY = %q, want false", env["MS2M_AGENT_KUBELET_INSECURE_SKIP_VERIFY"].Value)
		}
		if ca := env["MS2M_AGENT_KUBELET_CA_FILE"].Value; ca != "" && hostDir("MS2M_AGENT_KUBELET_CA_FILE", filepath.Dir(ca)) == nil {
			t.Errorf("MS2M_AGENT_KUBELET_CA_FILE=%s: its folder is not mounted from the host", ca)
		}
	} else if env["MS2M_AGENT_KUBELET_URL"].Value != "" {
		t.Errorf("MS2M_AGENT_KUBELET_URL is set, but the agent has no right to checkpoint")
	}
	if auth := env["MS2M_AGENT_REGISTRY_AUTH_FILE"].Value; auth != "" {
		av := secrets[mounted[filepath.Dir(auth)]]
		if av == nil || len(av.Items) != 1 || av.Items[0].Key != ".dockerconfigjson" || av.Items[0].Path != filepath.Base(auth) {
			t.Errorf("MS2M_AGENT_REGISTRY_AUTH_FILE=%s is not the .dockerconfigjson of a mounted Secret", auth)
		}
	}
}

// checkAgentCertificate checks the agents' Secret the chart made: a
// certificate for name, signed by its ca.crt, with its key.
func checkAgentCertificate(t *testing.T, s *corev1.Secret, name string) {
	t.Helper()
	if _, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"]); err != nil {
		t.Errorf("Secret %s: tls.crt and tls.key are not a pair: %v", s.Name, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.Data["ca.crt"]) {
		t.Fatalf("Secret %s: no CA in ca.crt", s.Name)
	}
	blk, _ := pem.Decode(s.Data["tls.crt"])
	if blk == nil {
		t.Fatalf("Secret %s: tls.crt is not PEM", s.Name)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
		t.Errorf("Secret %s: the certificate does not verify for %s against ca.crt: %v", s.Name, name, err)
	}
}

// TestAgentCheckpointsThroughTheAPIServer: the opt-in fallback for
// kubelets that do not take ServiceAccount tokens. The migrator then holds
// create on nodes/proxy, and the agent no right and no token.
func TestAgentCheckpointsThroughTheAPIServer(t *testing.T) {
	r := render(t, values(t, `migrator: {checkpointVia: apiserver}`))
	checkRules(t, r, "ms2m-migrator", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, Verbs: []string{"create"}},
	})
	if _, ok := r.find("ClusterRole", "", "ms2m-agent"); ok {
		t.Error("ClusterRole ms2m-agent: the agent takes no checkpoints, so it needs no right")
	}
	checkAgent(t, r)
	d := typed[appsv1.Deployment](t, r.get(t, "Deployment", r.namespace, "ms2m-controller"))
	if got := envMap(d.Spec.Template.Spec.Containers[0])["MS2M_CHECKPOINT_VIA"].Value; got != "apiserver" {
		t.Errorf("MS2M_CHECKPOINT_VIA = %q, want apiserver", got)
	}
}

// TestPullSecretNames: migrator.pullSecretNames grants get on Secrets of
// those names only, for the pre-pull with a pod's imagePullSecrets; the
// default grants none (TestDefaults).
func TestPullSecretNames(t *testing.T) {
	r := render(t, values(t, `migrator: {pullSecretNames: [regcred, team-pull]}`))
	checkRules(t, r, "ms2m-migrator-workloads", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "create", "delete", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "update", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"regcred", "team-pull"}, Verbs: []string{"get"}},
	})
}

// TestAgentKubeletCA: the kubelet's own self-signed certificate on the
// node, mounted read-only, as what the agent checks its kubelet against.
func TestAgentKubeletCA(t *testing.T) {
	r := render(t, values(t, `agent: {kubelet: {caFile: /var/lib/kubelet/pki/kubelet.crt}}`))
	checkAgent(t, r)
	ds := typed[appsv1.DaemonSet](t, r.get(t, "DaemonSet", r.namespace, "ms2m-agent"))
	if got := envMap(ds.Spec.Template.Spec.Containers[0])["MS2M_AGENT_KUBELET_CA_FILE"].Value; got != "/var/lib/kubelet/pki/kubelet.crt" {
		t.Errorf("MS2M_AGENT_KUBELET_CA_FILE = %q", got)
	}
}

// TestAgentTLSFromCertManager: cert-manager makes the agents' certificate
// for the name the migrator checks, into the Secret both mount.
func TestAgentTLSFromCertManager(t *testing.T) {
	r := render(t, values(t, certManagerValues))
	if _, ok := r.find("Secret", r.namespace, "ms2m-agent-tls"); ok {
		t.Error("with cert-manager, the chart must not make the agents' Secret itself")
	}
	crt := r.get(t, "Certificate", r.namespace, "ms2m-agent")
	spec, _ := crt.Object["spec"].(map[string]any)
	if spec["secretName"] != "ms2m-agent-tls" || !cmp.Equal(spec["dnsNames"], []any{"ms2m-agent." + r.namespace}) {
		t.Errorf("Certificate ms2m-agent: secretName %v, dnsNames %v; want ms2m-agent-tls for ms2m-agent.%s", spec["secretName"], spec["dnsNames"], r.namespace)
	}
	checkAgent(t, r)
}

func TestCertManager(t *testing.T) {
	r := render(t, values(t, certManagerValues))
	d := webhookDeployment(t, r)
	if got := *d.Spec.Replicas; got != 2 {
		t.Errorf("webhook replicas = %d, want 2 with cert-manager", got)
	}
	env := envMap(d.Spec.Template.Spec.Containers[0])
	if _, ok := env["MS2M_WEBHOOK_SELF_SIGNED"]; ok {
		t.Error("with cert-manager the webhook must not make its own certificate")
	}

	cert := typed[certmanagerv1.Certificate](t, r.get(t, "Certificate", releaseNS, "ms2m-webhook"))
	vol := d.Spec.Template.Spec.Volumes[0]
	if vol.Secret == nil || vol.Secret.SecretName != cert.Spec.SecretName {
		t.Errorf("the webhook mounts %+v, want the Certificate's Secret %s", vol, cert.Spec.SecretName)
	}
	mwc := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, r.get(t, "MutatingWebhookConfiguration", "", "ms2m-webhook"))
	if got, want := mwc.Annotations["cert-manager.io/inject-ca-from"], releaseNS+"/"+cert.Name; got != want {
		t.Errorf("inject-ca-from = %q, want %q", got, want)
	}
	checkRegistration(t, r, mwc, d)
	svc := mwc.Webhooks[0].ClientConfig.Service
	mustContain(t, "the certificate's names", cert.Spec.DNSNames, svc.Name+"."+svc.Namespace+".svc")
	issuer := typed[certmanagerv1.Issuer](t, r.get(t, cert.Spec.IssuerRef.Kind, releaseNS, cert.Spec.IssuerRef.Name))
	if issuer.Spec.SelfSigned == nil {
		t.Errorf("Issuer %s is not self-signed: %+v", issuer.Name, issuer.Spec)
	}

	// Two replicas, and a budget that keeps one through a drain.
	pdb := typed[policyv1.PodDisruptionBudget](t, r.get(t, "PodDisruptionBudget", releaseNS, "ms2m-webhook"))
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) || pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget %+v does not keep one webhook pod (%v)", pdb.Spec, err)
	}

	// cert-manager, not the webhook, owns the caBundle.
	checkRules(t, r, "ms2m-webhook", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
	})

	sm := typed[monitoringv1.ServiceMonitor](t, r.get(t, "ServiceMonitor", releaseNS, "ms2m-webhook"))
	smSel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	webhookSvc := typed[corev1.Service](t, r.get(t, "Service", releaseNS, svc.Name))
	if !smSel.Matches(labels.Set(webhookSvc.Labels)) {
		t.Errorf("ServiceMonitor selects %s, which the webhook Service's labels %v do not match", smSel, webhookSvc.Labels)
	}
	hasPort := false
	for _, p := range webhookSvc.Spec.Ports {
		hasPort = hasPort || p.Name == sm.Spec.Endpoints[0].Port
	}
	if !hasPort {
		t.Errorf("ServiceMonitor scrapes port %q, which the Service lacks", sm.Spec.Endpoints[0].Port)
	}

	csm := typed[monitoringv1.ServiceMonitor](t, r.get(t, "ServiceMonitor", releaseNS, "ms2m-controller"))
	csmSel, err := metav1.LabelSelectorAsSelector(&csm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range r.ofKind("Service") {
		if got, want := csmSel.Matches(labels.Set(o.GetLabels())), o.GetName() == "ms2m-controller"; got != want {
			t.Errorf("the controller's ServiceMonitor selects Service %s: %v, want %v", o.GetName(), got, want)
		}
	}
	if csm.Spec.Endpoints[0].Port != "metrics" {
		t.Errorf("the controller's ServiceMonitor scrapes port %q, want metrics", csm.Spec.Endpoints[0].Port)
	}
}

func TestExternalIssuer(t *testing.T) {
	r := render(t, values(t, `
certManager:
  enabled: true
  issuerRef: {kind: ClusterIssuer, name: company-ca, group: cert-manager.io}
webhook: {replicas: 3}
`))
	if _, ok := r.find("Issuer", releaseNS, "ms2m-webhook-selfsigned"); ok {
		t.Error("with an issuerRef the chart must not make its own Issuer")
	}
	cert := typed[certmanagerv1.Certificate](t, r.get(t, "Certificate", releaseNS, "ms2m-webhook"))
	if cert.Spec.IssuerRef.Kind != "ClusterIssuer" || cert.Spec.IssuerRef.Name != "company-ca" {
		t.Errorf("issuerRef = %+v", cert.Spec.IssuerRef)
	}
	if got := *webhookDeployment(t, r).Spec.Replicas; got != 3 {
		t.Errorf("replicas = %d, want 3", got)
	}
}

// TestConfined: with workloadNamespaces, ms2m reaches only those
// namespaces: the webhook is called only there, and every namespaced
// permission is a RoleBinding there.
func TestConfined(t *testing.T) {
	r := render(t, values(t, confinedValues))
	namespaces := []string{"shop", "jobs"}

	mwc := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, r.get(t, "MutatingWebhookConfiguration", "", "ms2m-webhook"))
	checkPinned(t, mwc, "confined")
	for ns, want := range map[string]bool{"shop": true, "jobs": true, "default": false, "kube-system": false, releaseNS: false} {
		// Opted in by its label or not, a namespace is called for only
		// when it is a workload namespace.
		for _, nsLabels := range []labels.Set{{"kubernetes.io/metadata.name": ns}, {"kubernetes.io/metadata.name": ns, contract.LabelNamespaceInject: "enabled"}} {
			got := false
			for _, wh := range mwc.Webhooks {
				sel, err := metav1.LabelSelectorAsSelector(wh.NamespaceSelector)
				if err != nil {
					t.Fatal(err)
				}
				got = got || sel.Matches(nsLabels)
			}
			if got != want {
				t.Errorf("the webhooks' namespaceSelectors select %v: %v, want %v", nsLabels, got, want)
			}
		}
	}
	for _, name := range []string{"ms2m-webhook-workloads", "ms2m-migrator-workloads", "ms2m-controller-workloads"} {
		if _, ok := r.find("ClusterRoleBinding", "", name); ok {
			t.Errorf("ClusterRoleBinding %s grants namespaced permissions everywhere; want RoleBindings in %v", name, namespaces)
		}
	}
	for _, ns := range namespaces {
		for who, subjects := range map[string][]string{
			"ms2m-webhook": {"ms2m-webhook"}, "ms2m-migrator": {"ms2m-migrator", "ms2m-controller"}, "ms2m-controller": {"ms2m-controller"},
		} {
			rb := typed[rbacv1.RoleBinding](t, r.get(t, "RoleBinding", ns, who))
			if rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != who+"-workloads" || !cmp.Equal(subjectNames(rb.Subjects), subjects) {
				t.Errorf("RoleBinding %s/%s: %+v %+v, want subjects %v", ns, who, rb.RoleRef, rb.Subjects, subjects)
			}
		}
		// No shared stream URI: the controller writes ms2m-broker-user.
		if _, ok := r.find("Secret", ns, "ms2m-broker"); ok {
			t.Errorf("Secret %s/ms2m-broker rendered beside per-namespace broker users", ns)
		}
		// The control token is the webhook's to write, each namespace's own.
		if _, ok := r.find("Secret", ns, "ms2m-control"); ok {
			t.Errorf("the chart renders Secret %s/ms2m-control; the webhook writes each namespace's own token", ns)
		}
	}

	cr := typed[rbacv1.ClusterRole](t, r.get(t, "ClusterRole", "", "ms2m-kubelet-checkpoint"))
	if diff := cmp.Diff([]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/checkpoint"}, Verbs: []string{"create"}}}, cr.Rules); diff != "" {
		t.Errorf("kubelet checkpoint rules (-want +got):\n%s", diff)
	}
	crb := typed[rbacv1.ClusterRoleBinding](t, r.get(t, "ClusterRoleBinding", "", "ms2m-kubelet-checkpoint"))
	if len(crb.Subjects) != 1 || crb.Subjects[0].Kind != "User" || crb.Subjects[0].Name != "kube-apiserver-kubelet-client" {
		t.Errorf("kubelet checkpoint subjects = %+v", crb.Subjects)
	}

	ds := typed[appsv1.DaemonSet](t, r.get(t, "DaemonSet", releaseNS, "ms2m-agent"))
	env := envMap(ds.Spec.Template.Spec.Containers[0])
	if env["MS2M_AGENT_REGISTRY_INSECURE"].Value != "true" || env["MS2M_AGENT_REGISTRY_AUTH_FILE"].Value == "" {
		t.Errorf("registry settings not passed to the agent: %+v", env)
	}
	checkAgent(t, r)
	checkController(t, r, "ms2m", "registry.example.com:5000/ms2m/checkpoints")
}

// TestReleaseNames: a second release gets names of its own, and the
// webhook's names still point at its own objects.
func TestReleaseNames(t *testing.T) {
	r := renderAs(t, "edge", "edge-system", values(t, `
image: {registry: "registry.example.com:5000/team", tag: "1.2.3"}
migrator: {checkpointRepository: ""}
`))
	d := typed[appsv1.Deployment](t, r.get(t, "Deployment", "edge-system", "edge-ms2m-webhook"))
	env := envMap(d.Spec.Template.Spec.Containers[0])
	mwc := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, r.get(t, "MutatingWebhookConfiguration", "", env["MS2M_WEBHOOK_CONFIG_NAME"].Value))
	checkRegistration(t, r, mwc, d)
	if env["MS2M_WEBHOOK_SERVICE_NAME"].Value != mwc.Webhooks[0].ClientConfig.Service.Name {
		t.Errorf("MS2M_WEBHOOK_SERVICE_NAME = %q, the registration calls %q", env["MS2M_WEBHOOK_SERVICE_NAME"].Value, mwc.Webhooks[0].ClientConfig.Service.Name)
	}
	checkRules(t, r, "edge-ms2m-webhook", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"}, ResourceNames: []string{"edge-ms2m-webhook"}, Verbs: []string{"get", "update"}},
	})
	if got, want := d.Spec.Template.Spec.Containers[0].Image, "registry.example.com:5000/team/ms2m/webhook:1.2.3"; got != want {
		t.Errorf("image = %q, want %q", got, want)
	}
	if got, want := env["MS2M_WEBHOOK_SIDECAR_IMAGE"].Value, "registry.example.com:5000/team/ms2m/sidecar:1.2.3"; got != want {
		t.Errorf("sidecar image = %q, want %q", got, want)
	}
	if _, ok := r.find("DaemonSet", "edge-system", "edge-ms2m-agent"); !ok {
		t.Errorf("no agent DaemonSet edge-ms2m-agent: %v", r.names())
	}
	// Checkpoint images go under image.registry unless told otherwise.
	checkController(t, r, "edge-ms2m", "registry.example.com:5000/team/ms2m/checkpoints")
	role := typed[rbacv1.Role](t, r.get(t, "Role", "edge-system", "edge-ms2m-controller-leader-election"))
	if role.Rules[1].ResourceNames[0] != "ms2m-migrator" {
		t.Errorf("the lease the controller takes is ms2m-migrator whatever the release; the Role grants %v", role.Rules[1].ResourceNames)
	}
}

// TestEnvIsDocumented: every variable the chart sets is one the binaries
// read, as their docs list them; a misspelt name would be ignored.
func TestEnvIsDocumented(t *testing.T) {
	documented := func(doc, prefix string) map[string]bool {
		b, err := os.ReadFile(filepath.Join(repoRoot, "docs", doc))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, v := range regexp.MustCompile("`("+prefix+"[A-Z_]+)`").FindAllStringSubmatch(string(b), -1) {
			m[v[1]] = true
		}
		if len(m) < 5 {
			t.Fatalf("docs/%s lists only %v", doc, m)
		}
		return m
	}
	webhookVars := documented("webhook.md", "MS2M_WEBHOOK_")
	agentVars := documented("migrator.md", "MS2M_AGENT_")
	migratorVars := documented("migrator.md", "MS2M_")
	for _, text := range []string{"", certManagerValues, confinedValues, `webhook: {selfSigned: {extraHosts: [a.example.com]}, sidecar: {image: {pullPolicy: Always}}}`, `secrets: {natsURL: {name: ms2m-nats}}`} {
		r := render(t, values(t, text))
		for _, e := range webhookDeployment(t, r).Spec.Template.Spec.Containers[0].Env {
			if !webhookVars[e.Name] {
				t.Errorf("the webhook Deployment sets %s, which docs/webhook.md does not list", e.Name)
			}
		}
		ds := typed[appsv1.DaemonSet](t, r.get(t, "DaemonSet", releaseNS, "ms2m-agent"))
		for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
			// NODE_NAME is for $(NODE_NAME) in the paths below it (values.yaml,
			// agent.checkpointDir); the agent itself does not read it.
			if e.Name != "NODE_NAME" && !agentVars[e.Name] {
				t.Errorf("the agent DaemonSet sets %s, which docs/migrator.md does not list", e.Name)
			}
		}
		cd := typed[appsv1.Deployment](t, r.get(t, "Deployment", releaseNS, "ms2m-controller"))
		for _, e := range cd.Spec.Template.Spec.Containers[0].Env {
			if !migratorVars[e.Name] {
				t.Errorf("the controller Deployment sets %s, which docs/migrator.md does not list", e.Name)
			}
		}
	}
}

func TestAgentDisabled(t *testing.T) {
	r := render(t, values(t, `agent: {enabled: false}`))
	if n := len(r.ofKind("DaemonSet")); n != 0 {
		t.Errorf("%d DaemonSets with agent.enabled=false", n)
	}
	if !strings.Contains(r.notes, "no node agent") {
		t.Errorf("NOTES must say that migrations need an agent:\n%s", r.notes)
	}
}

// TestAgentPerNodePaths: nodes that share one host filesystem (the local
// cluster) name their folders by $(NODE_NAME); the agent mounts the folder
// that holds them all, once, read-only, and gets the paths with the node's
// name expanded by Kubernetes.
func TestAgentPerNodePaths(t *testing.T) {
	r := render(t, values(t, `
image: {registry: "registry.example.com:5000"}
agent:
  checkpointDir: /var/tmp/lab/$(NODE_NAME)/kubelet/checkpoints
  runtimeEndpoint: unix:///var/tmp/lab/$(NODE_NAME)/containerd.sock
  criuLogDirs: [/var/tmp/lab/$(NODE_NAME)/containerd/state, /run/other]
`))
	checkAgent(t, r)
	ds := typed[appsv1.DaemonSet](t, r.get(t, "DaemonSet", r.namespace, "ms2m-agent"))
	var dirs []string
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			dirs = append(dirs, v.HostPath.Path)
		}
	}
	if diff := cmp.Diff([]string{"/var/tmp/lab", "/run/other"}, dirs); diff != "" {
		t.Errorf("host folders (-want +got):\n%s", diff)
	}
	env := envMap(ds.Spec.Template.Spec.Containers[0])
	if got := env["MS2M_AGENT_CHECKPOINT_DIR"].Value; got != "/var/tmp/lab/$(NODE_NAME)/kubelet/checkpoints" {
		t.Errorf("MS2M_AGENT_CHECKPOINT_DIR = %s", got)
	}
}

// TestAgentWatchFreeze: agent.watchFreeze gives the agent the host's PID
// namespace and the host's cgroups, read-only (its freeze watch); by
// default it has neither.
func TestAgentWatchFreeze(t *testing.T) {
	for _, watch := range []bool{false, true} {
		r := render(t, values(t, fmt.Sprintf(`agent: {watchFreeze: %v}`, watch)))
		checkAgent(t, r)
		ds := typed[appsv1.DaemonSet](t, r.get(t, "DaemonSet", r.namespace, "ms2m-agent"))
		spec := ds.Spec.Template.Spec
		if spec.HostPID != watch {
			t.Errorf("watchFreeze %v: hostPID %v", watch, spec.HostPID)
		}
		cgroup := false
		for _, v := range spec.Volumes {
			cgroup = cgroup || (v.HostPath != nil && v.HostPath.Path == "/sys/fs/cgroup")
		}
		if cgroup != watch {
			t.Errorf("watchFreeze %v: the host's /sys/fs/cgroup mounted %v", watch, cgroup)
		}
	}
}

// TestNATSURLSecret: secrets.natsURL names the Secret that NATS apps'
// sidecars read their log server's URL from (MS2M_WEBHOOK_NATS_URL_SECRET
// and its key); left empty, the webhook gets neither and leaves NATS pods
// alone.
func TestNATSURLSecret(t *testing.T) {
	env := envMap(webhookDeployment(t, render(t, nil)).Spec.Template.Spec.Containers[0])
	for _, k := range []string{"MS2M_WEBHOOK_NATS_URL_SECRET", "MS2M_WEBHOOK_NATS_URL_SECRET_KEY"} {
		if e, ok := env[k]; ok {
			t.Errorf("by default the webhook env sets %s=%q; want it unset (NATS pods left alone)", k, e.Value)
		}
	}
	env = envMap(webhookDeployment(t, render(t, values(t, `secrets: {natsURL: {name: ms2m-nats, key: url}}`))).Spec.Template.Spec.Containers[0])
	for k, want := range map[string]string{"MS2M_WEBHOOK_NATS_URL_SECRET": "ms2m-nats", "MS2M_WEBHOOK_NATS_URL_SECRET_KEY": "url"} {
		if got := env[k].Value; got != want {
			t.Errorf("webhook env %s = %q, want %q", k, got, want)
		}
	}
}
