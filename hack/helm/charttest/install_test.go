package charttest

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ms2m/ms2m/internal/contract"
)

// kubeconfig writes a kubeconfig for user on the test control plane.
func kubeconfig(t testing.TB, user envtest.User) string {
	t.Helper()
	requireAPIServer(t)
	u, err := apiserver.env.AddUser(user, nil)
	if err != nil {
		t.Fatalf("add user %s: %v", user.Name, err)
	}
	b, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestHelmInstallAndUpgrade installs the chart with the helm command line
// into a real API server, upgrades it, and uninstalls it: the generated
// tokens survive the upgrade (the chart looks them up), and uninstall
// leaves nothing cluster-scoped behind.
func TestHelmInstallAndUpgrade(t *testing.T) {
	cfg := requireAPIServer(t)
	helmBin(t)
	c := newCluster(t, cfg)
	kc := kubeconfig(t, envtest.User{Name: "charttest-admin", Groups: []string{"system:masters"}})
	const rel, ns, shop = "inst", "inst-system", "inst-shop"
	c.createNamespaces(t, shop)
	vals := writeValues(t, `
workloadNamespaces: [inst-shop]
secrets:
  create: true
`)
	run := func(args ...string) string {
		t.Helper()
		out, err := helm(t, append(args, "--kubeconfig", kc)...)
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	secret := func(ns, name, key string) []byte {
		t.Helper()
		s, err := c.cs.CoreV1().Secrets(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Secret %s/%s: %v", ns, name, err)
		}
		return s.Data[key]
	}

	out := run(append([]string{"install", rel, chartDir, "-n", ns, "--create-namespace"}, withBase(t, vals)...)...)
	if !strings.Contains(out, "STATUS: deployed") || !strings.Contains(out, contract.AnnotationMigrateTo+"=<node>") {
		t.Errorf("helm install says:\n%s", out)
	}
	agentToken := secret(ns, "inst-ms2m-agent-token", "token")

	run(append([]string{"upgrade", rel, chartDir, "-n", ns, "--set", "webhook.logLevel=debug", "--set", "migrator.controller.replicas=3"}, withBase(t, vals)...)...)
	if got := secret(ns, "inst-ms2m-agent-token", "token"); !bytes.Equal(got, agentToken) {
		t.Error("the upgrade changed the agents' token: the running agents and the migrator would disagree")
	}
	d, err := c.cs.AppsV1().Deployments(ns).Get(t.Context(), "inst-ms2m-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if envMap(d.Spec.Template.Spec.Containers[0])["MS2M_WEBHOOK_LOG_LEVEL"].Value != "debug" {
		t.Error("the upgrade did not reach the webhook Deployment")
	}
	cd, err := c.cs.AppsV1().Deployments(ns).Get(t.Context(), "inst-ms2m-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *cd.Spec.Replicas != 3 {
		t.Errorf("the upgrade did not reach the controller Deployment: %d replicas, want 3", *cd.Spec.Replicas)
	}

	run("uninstall", rel, "-n", ns)
	if _, err := c.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), "inst-ms2m-webhook", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after uninstall the MutatingWebhookConfiguration is still there (%v): it would block pods", err)
	}
	for _, name := range []string{"inst-ms2m-migrator", "inst-ms2m-controller"} {
		if _, err := c.cs.RbacV1().ClusterRoles().Get(t.Context(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("after uninstall ClusterRole %s is still there (%v)", name, err)
		}
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestWebhookRunsAsInstalled runs the real webhook binary the way the
// chart configures it: the Deployment's environment, the identity of the
// chart's ServiceAccount (so the chart's RBAC, nothing more), and the
// chart's MutatingWebhookConfiguration with its selectors and policies.
// Only what the test control plane cannot do is changed: the API server
// calls the webhook at a loopback URL instead of through the Service, and
// the ports and certificate folder are the test's.
func TestWebhookRunsAsInstalled(t *testing.T) {
	cfg := requireAPIServer(t)
	c := newCluster(t, cfg)
	const rel, ns, shop, elsewhere = "hook", "hook-system", "hook-shop", "hook-elsewhere"
	r := renderAs(t, rel, ns, values(t, `
workloadNamespaces: [hook-shop]
secrets:
  create: true
webhook:
  selfSigned: {extraHosts: [127.0.0.1]}
`))
	c.createNamespaces(t, ns, shop, elsewhere)

	port := freePort(t)
	var objs []*unstructured.Unstructured
	for _, o := range r.objs {
		if o.GetKind() == "MutatingWebhookConfiguration" {
			mwc := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, o)
			for i := range mwc.Webhooks {
				url := "https://127.0.0.1:" + strconv.Itoa(port) + *mwc.Webhooks[i].ClientConfig.Service.Path
				mwc.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url}
			}
			m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(mwc)
			if err != nil {
				t.Fatal(err)
			}
			o = &unstructured.Unstructured{Object: m}
			delete(o.Object["metadata"].(map[string]any), "creationTimestamp")
		}
		objs = append(objs, o)
	}
	c.applyAll(t, objs)

	// The binary, from the repository's own module.
	dir := t.TempDir()
	bin := filepath.Join(dir, "webhook")
	build := exec.Command("go", "build", "-o", bin, "./cmd/webhook")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build cmd/webhook: %v\n%s", err, out)
	}

	d := typed[appsv1.Deployment](t, r.get(t, "Deployment", ns, "hook-ms2m-webhook"))
	spec := d.Spec.Template.Spec
	kc := kubeconfig(t, envtest.User{
		Name:   "system:serviceaccount:" + ns + ":" + spec.ServiceAccountName,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	})
	// The signing key file, with what the chart's Secret holds (the
	// controller's key, which the webhook checks restores with).
	keySec, err := c.cs.CoreV1().Secrets(ns).Get(t.Context(), "ms2m-migration-status-key", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the signing key Secret: %v", err)
	}
	keyFile := filepath.Join(dir, "signing-key")
	if err := os.WriteFile(keyFile, keySec.Data["key"], 0o600); err != nil {
		t.Fatal(err)
	}
	health := "127.0.0.1:" + strconv.Itoa(freePort(t))
	env := []string{"PATH=/usr/bin:/bin", "KUBECONFIG=" + kc}
	for _, e := range spec.Containers[0].Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
				t.Fatalf("env %s comes from %+v, which this test cannot resolve", e.Name, e.ValueFrom)
			}
			v = ns
		}
		switch e.Name {
		case "MS2M_WEBHOOK_PORT":
			v = strconv.Itoa(port)
		case "MS2M_WEBHOOK_CERT_DIR":
			v = filepath.Join(dir, "certs")
		case "MS2M_WEBHOOK_SIGNING_KEY_FILE":
			v = keyFile
		case "MS2M_WEBHOOK_HEALTH_ADDR":
			v = health
		case "MS2M_WEBHOOK_METRICS_ADDR":
			v = "127.0.0.1:" + strconv.Itoa(freePort(t))
		}
		env = append(env, e.Name+"="+v)
	}
	logFile := filepath.Join(dir, "webhook.log")
	logf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // the webhook this test started, by its own handle
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("webhook log:\n%s", b)
		}
	})

	// Ready means: serving, namespace cache synced (list and watch on
	// namespaces), and the caBundle set (get and update on its own
	// registration), all with the chart's RBAC.
	waitFor(t, "the webhook's /readyz", time.Minute, func() (bool, error) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the webhook exited: %v", err)
		default:
		}
		resp, err := http.Get("http://" + health + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})

	ctx := t.Context()
	pod := func(ns, name string, labels, annotations map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels, Annotations: annotations},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "app", Image: "registry.example.com/consumer:1",
				Env: []corev1.EnvVar{{Name: "AMQP_URL", Value: "amqp://guest:guest@rabbit." + ns + ":5672/"}},
			}}},
		}
	}
	optIn := map[string]string{contract.AnnotationInject: "true"}
	sidecar := func(p *corev1.Pod) *corev1.Container {
		for i := range p.Spec.InitContainers {
			if p.Spec.InitContainers[i].Name == "ms2m-sidecar" {
				return &p.Spec.InitContainers[i]
			}
		}
		return nil
	}

	// An opted-in pod in a workload namespace is injected with what the
	// chart configured.
	got, err := c.cs.CoreV1().Pods(shop).Create(ctx, pod(shop, "consumer-0", nil, optIn), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create an opted-in pod: %v", err)
	}
	sc := sidecar(got)
	if sc == nil {
		t.Fatalf("the pod was not injected: init containers %v, annotations %v", got.Spec.InitContainers, got.Annotations)
	}
	if sc.Image != "ms2m/sidecar:0.1.0" {
		t.Errorf("sidecar image = %q, want the chart's ms2m/sidecar:0.1.0", sc.Image)
	}
	refs := map[string]string{}
	for _, e := range sc.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			refs[e.ValueFrom.SecretKeyRef.Name+"/"+e.ValueFrom.SecretKeyRef.Key] = e.Name
		}
	}
	// The stream URI from the namespace's own broker user, never a shared
	// one; the control token from the Secret the chart created.
	if refs["ms2m-broker-user/stream-uri"] != "MS2M_STREAM_URI" {
		t.Errorf("the sidecar's MS2M_STREAM_URI is not the namespace's broker user (ms2m-broker-user/stream-uri); it reads %v", refs)
	}
	for _, want := range []string{"ms2m-control/control-token"} {
		if refs[want] == "" {
			t.Errorf("the sidecar does not read Secret key %s, which the chart or the webhook made; it reads %v", want, refs)
		}
	}
	// The control token is the namespace's own, which the webhook wrote
	// (an HMAC, base64url) with the chart's RBAC before it admitted the pod.
	if s, err := c.cs.CoreV1().Secrets(shop).Get(ctx, "ms2m-control", metav1.GetOptions{}); err != nil || len(s.Data["control-token"]) != 43 {
		t.Errorf("Secret %s/ms2m-control: %v, %d bytes of control-token; want the webhook's derived token (43 bytes)", shop, err, len(s.Data["control-token"]))
	}
	// The Event, through the chart's RoleBinding in the workload namespace.
	waitFor(t, "the Injected Event", 30*time.Second, func() (bool, error) {
		evs, err := c.cs.EventsV1().Events(shop).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == "Injected" {
				return true, nil
			}
		}
		return false, nil
	})

	// A bad annotation is denied: the API server really calls the webhook.
	_, err = c.cs.CoreV1().Pods(shop).Create(ctx, pod(shop, "consumer-bad", nil, map[string]string{contract.AnnotationInject: "maybe"}), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), contract.AnnotationInject) {
		t.Errorf("a pod with ms2m.io/inject=maybe: %v, want a denial naming the annotation", err)
	}

	// The webhook runs with the controller's key, and a restore nothing
	// signed is denied (internal/webhook's suite has every forged kind).
	if b, err := os.ReadFile(logFile); err != nil || !strings.Contains(string(b), `"signingKey":true`) {
		t.Errorf("the webhook did not start with the signing key from Secret ms2m-migration-status-key (%v); its log:\n%s", err, b)
	}
	_, err = c.cs.CoreV1().Pods(shop).Create(ctx, pod(shop, "consumer-restore", nil, map[string]string{
		contract.AnnotationRestoreImage: "registry.example.com/ms2m/checkpoints/other/consumer@sha256:00", contract.AnnotationRestoreNode: "node-b",
		contract.AnnotationReplayStart: "0", contract.AnnotationReplayCutoff: "marker", contract.AnnotationLogName: shop + ".consumer", contract.AnnotationMigrationName: "m1",
	}), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "has no signature") {
		t.Errorf("an unsigned restore: %v, want a denial saying it has no signature", err)
	}

	// The selectors: a pod labelled ms2m.io/inject=false (which the webhook
	// sees, for its images, but never injects), a pod outside the workload
	// namespaces and a pod in the release namespace are not injected,
	// whatever their annotations say.
	for _, p := range []*corev1.Pod{
		pod(shop, "opted-out", map[string]string{contract.LabelInject: "false"}, optIn),
		pod(elsewhere, "consumer-0", nil, optIn),
		pod(ns, "consumer-0", nil, optIn),
	} {
		got, err := c.cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("create pod %s/%s: %v", p.Namespace, p.Name, err)
			continue
		}
		if sidecar(got) != nil {
			t.Errorf("pod %s/%s (labels %v) was injected; the chart's selectors should keep the webhook away from it", p.Namespace, p.Name, p.Labels)
		}
	}
}

// TestControllerRunsAsInstalled runs the real `migrator controller` the way
// the chart configures it: the Deployment's environment, the agents' token
// from the chart's Secret, and the identity of the chart's ServiceAccount,
// confined to one workload namespace (so the chart's RBAC, nothing more).
// It must take the lease, become ready, and refuse a request for a node
// that does not exist: reading the pod and the node, recording the outcome
// on the pod and an Event beside it. Only the ports are the test's, and the
// MutatingWebhookConfiguration is left out, as no webhook runs here.
func TestControllerRunsAsInstalled(t *testing.T) {
	cfg := requireAPIServer(t)
	c := newCluster(t, cfg)
	const rel, ns, shop = "ctl", "ctl-system", "ctl-shop"
	// The real broker's management API: the installed controller makes the
	// workload namespace's broker user there, with the chart's RBAC. A user
	// prefix of this run's own keeps it apart from others on the broker.
	mgmt := requireManagement(t)
	prefix := "ms2m-charttest-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "."
	t.Cleanup(func() { mgmt.deleteUser(t, prefix+shop) })
	r := renderAs(t, rel, ns, values(t, `
workloadNamespaces: [ctl-shop]
brokerUsers:
  managementURL: `+mgmt.url+`
  streamAddress: rabbitmq-stream://127.0.0.1:5552/
  userPrefix: `+prefix+`
  adminSecret: {name: rabbit-admin}
`))
	c.createNamespaces(t, ns, shop)
	if _, err := c.cs.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "rabbit-admin", Namespace: ns},
		StringData: map[string]string{"username": mgmt.user, "password": mgmt.password},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	for _, o := range r.objs {
		if o.GetKind() != "MutatingWebhookConfiguration" {
			objs = append(objs, o)
		}
	}
	c.applyAll(t, objs)
	ctx := t.Context()

	dir := t.TempDir()
	bin := filepath.Join(dir, "migrator")
	build := exec.Command("go", "build", "-o", bin, "./cmd/migrator")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build cmd/migrator: %v\n%s", err, out)
	}

	d := typed[appsv1.Deployment](t, r.get(t, "Deployment", ns, "ctl-ms2m-controller"))
	spec := d.Spec.Template.Spec
	kc := kubeconfig(t, envtest.User{
		Name:   "system:serviceaccount:" + ns + ":" + spec.ServiceAccountName,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	})
	// The token file, with what the chart's Secret holds.
	tv := spec.Volumes[0].Secret
	sec, err := c.cs.CoreV1().Secrets(ns).Get(ctx, tv.SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the agents' token Secret %s: %v", tv.SecretName, err)
	}
	tokenFile := filepath.Join(dir, "agent-token")
	if err := os.WriteFile(tokenFile, sec.Data[tv.Items[0].Key], 0o600); err != nil {
		t.Fatal(err)
	}
	// The status key file, with what the chart's Secret holds.
	keySec, err := c.cs.CoreV1().Secrets(ns).Get(ctx, "ms2m-migration-status-key", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the status key Secret: %v", err)
	}
	keyFile := filepath.Join(dir, "status-key")
	if err := os.WriteFile(keyFile, keySec.Data["key"], 0o600); err != nil {
		t.Fatal(err)
	}
	// The agents' CA file, with what the chart's agent Secret holds: the
	// controller reads it at start.
	var caFile string
	for _, v := range spec.Volumes {
		if v.Name != "agent-ca" || v.Secret == nil {
			continue
		}
		caSec, err := c.cs.CoreV1().Secrets(ns).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the agents' TLS Secret %s: %v", v.Secret.SecretName, err)
		}
		caFile = filepath.Join(dir, "agent-ca.crt")
		if err := os.WriteFile(caFile, caSec.Data[v.Secret.Items[0].Key], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The broker administrator's files, with what its Secret holds.
	adminFiles := map[string]string{}
	for _, v := range spec.Volumes {
		if v.Secret == nil || v.Secret.SecretName != "rabbit-admin" {
			continue
		}
		as, err := c.cs.CoreV1().Secrets(ns).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range v.Secret.Items {
			f := filepath.Join(dir, "broker-admin-"+it.Path)
			if err := os.WriteFile(f, as.Data[it.Key], 0o600); err != nil {
				t.Fatal(err)
			}
			adminFiles["/etc/ms2m/broker-admin/"+it.Path] = f
		}
	}
	health := "127.0.0.1:" + strconv.Itoa(freePort(t))
	env := []string{"PATH=/usr/bin:/bin", "KUBECONFIG=" + kc}
	for _, e := range spec.Containers[0].Env {
		if e.ValueFrom != nil {
			t.Fatalf("env %s comes from %+v, which this test cannot resolve", e.Name, e.ValueFrom)
		}
		v := e.Value
		switch e.Name {
		case "MS2M_AGENT_TOKEN_FILE":
			v = tokenFile
		case "MS2M_STATUS_KEY_FILE":
			v = keyFile
		case "MS2M_AGENT_CA_FILE":
			if v = caFile; v == "" {
				t.Fatalf("%s=%s: no agent-ca volume", e.Name, e.Value)
			}
		case "MS2M_BROKER_ADMIN_USERNAME_FILE", "MS2M_BROKER_ADMIN_PASSWORD_FILE":
			if v = adminFiles[e.Value]; v == "" {
				t.Fatalf("%s=%s is no file of the mounted Secret rabbit-admin (%v)", e.Name, e.Value, adminFiles)
			}
		case "MS2M_HEALTH_ADDR":
			v = health
		case "MS2M_METRICS_ADDR":
			v = "127.0.0.1:" + strconv.Itoa(freePort(t))
		}
		env = append(env, e.Name+"="+v)
	}
	logFile := filepath.Join(dir, "controller.log")
	logf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, spec.Containers[0].Args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // the controller this test started, by its own handle
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("controller log:\n%s", b)
		}
	})
	running := func() {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the controller exited: %v", err)
		default:
		}
	}

	// Leader: the lease in the release namespace names this process.
	waitFor(t, "the controller to take Lease ms2m-migrator", time.Minute, func() (bool, error) {
		running()
		l, err := c.cs.CoordinationV1().Leases(ns).Get(ctx, "ms2m-migrator", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", nil
	})
	// Ready: its cache of pods, listed and watched cluster-wide, synced.
	waitFor(t, "the controller's /readyz", time.Minute, func() (bool, error) {
		running()
		resp, err := http.Get("http://" + health + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})

	// The workload namespace's broker user: its Secret written with the
	// chart's RBAC, the user confined to the namespace's logs.
	waitFor(t, "the broker user's Secret in "+shop, time.Minute, func() (bool, error) {
		running()
		s, err := c.cs.CoreV1().Secrets(shop).Get(ctx, "ms2m-broker-user", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && strings.HasPrefix(string(s.Data["stream-uri"]), "rabbitmq-stream://"+prefix+shop+":"), err
	})
	if got := mgmt.permissions(t, prefix+shop); got != `^ctl-shop\.` {
		t.Errorf("broker user %s%s may configure %q, want ^ctl-shop\\.", prefix, shop, got)
	}

	// A request for a node that does not exist: refused, and nothing
	// touched but the record on the pod and the Event.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer-0", Namespace: shop, Annotations: map[string]string{
			contract.AnnotationStatus: "{}", contract.AnnotationMigrateTo: "node-b",
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example.com/consumer:1"}}},
	}
	if _, err := c.cs.CoreV1().Pods(shop).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", shop, pod.Name, err)
	}
	var status map[string]any
	waitFor(t, "the migration's status on the pod", time.Minute, func() (bool, error) {
		running()
		p, err := c.cs.CoreV1().Pods(shop).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		raw, ok := p.Annotations[contract.AnnotationMigrationStatus]
		if !ok {
			return false, nil
		}
		return true, json.Unmarshal([]byte(raw), &status)
	})
	if msg, _ := status["message"].(string); status["phase"] != "Failed" || !strings.Contains(msg, `"node-b" not found`) {
		t.Errorf("status = %v, want phase Failed with the node not found (a forbidden Get would mean missing RBAC)", status)
	}
	waitFor(t, "the MigrationRejected Event", 30*time.Second, func() (bool, error) {
		evs, err := c.cs.EventsV1().Events(shop).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == "MigrationRejected" && e.Regarding.Name == pod.Name {
				return true, nil
			}
		}
		return false, nil
	})

	// A denial that the controller survives still shows in its log: the
	// pod watch, the lease renewal (every 2s), an Event. None may.
	running()
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "forbidden") {
			t.Errorf("the chart's RBAC denied the controller something:\n%s", line)
		}
	}
}

// management is RabbitMQ's management API and the administrator that
// hack/setup.sh makes (MS2M_TEST_MANAGEMENT_URL, MS2M_BROKER_ADMIN_USER and
// MS2M_BROKER_ADMIN_PASSWORD override them).
type management struct{ url, user, password string }

func requireManagement(t *testing.T) management {
	t.Helper()
	env := func(k, def string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return def
	}
	m := management{
		url:      env("MS2M_TEST_MANAGEMENT_URL", "http://127.0.0.1:15672"),
		user:     env("MS2M_BROKER_ADMIN_USER", "ms2m-admin"),
		password: env("MS2M_BROKER_ADMIN_PASSWORD", "ms2m-admin-test"),
	}
	resp, err := m.do(http.MethodGet, "/api/whoami")
	if err != nil || resp.StatusCode != http.StatusOK {
		missing(t, "RabbitMQ's management API at "+m.url+" with the administrator "+m.user+" ("+fmtErr(resp, err)+")",
			"run `bash hack/setup.sh` (it enables rabbitmq_management on the running broker and makes the administrator)")
	}
	resp.Body.Close()
	return m
}

func (m management) do(method, path string) (*http.Response, error) {
	req, err := http.NewRequest(method, m.url+path, nil)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(m.user, m.password)
	return (&http.Client{Timeout: 10 * time.Second}).Do(req)
}

// permissions is the user's configure permission on the vhost "/".
func (m management) permissions(t *testing.T, user string) string {
	t.Helper()
	resp, err := m.do(http.MethodGet, "/api/permissions/%2F/"+user)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p struct{ Configure string }
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&p) != nil {
		t.Fatalf("permissions of broker user %s: %s", user, resp.Status)
	}
	return p.Configure
}

func (m management) deleteUser(t *testing.T, user string) {
	resp, err := m.do(http.MethodDelete, "/api/users/"+user)
	if err != nil {
		t.Errorf("delete broker user %s: %v", user, err)
		return
	}
	resp.Body.Close()
}

func fmtErr(resp *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	return resp.Status
}
