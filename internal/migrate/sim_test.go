package migrate_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/testenv"
)

// The simulated-cluster suite: the migrator against a real kube-apiserver,
// etcd and kube-controller-manager, the real webhook and agent, and
// simulated nodes, sidecars and apps (internal/simcluster). It shows, for
// every strategy, the API calls in order (golden files in testdata/calls,
// regenerated with -update), the pods made, the checkpoint image's layout,
// and what is left after each failure.

var update = flag.Bool("update", false, "rewrite testdata/calls/*.txt from this run")

const (
	nodeA = "sim-a"
	nodeB = "sim-b"
)

var sim struct {
	once    sync.Once
	c       *simcluster.Cluster
	missing string
	err     error
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if sim.c != nil {
		if err := sim.c.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "simulated cluster: close: %v\n", err)
		}
	}
	os.Exit(code)
}

// cluster returns the shared simulated cluster, started on first use.
func cluster(t *testing.T) *simcluster.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("the simulated cluster is an integration test (-short)")
	}
	testenv.WatchdogFor(t, 5*time.Minute)
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		_, file, _, _ := runtime.Caller(0)
		assets = filepath.Join(filepath.Dir(file), "..", "..", "bin", "k8s")
	}
	sim.once.Do(func() {
		if sim.missing = simcluster.Missing(assets); sim.missing != "" {
			return
		}
		sim.c, sim.err = simcluster.Start(simcluster.Options{Assets: assets, Nodes: []string{nodeA, nodeB}, Scheduler: true,
			Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, "sim: "+f+"\n", a...) }})
	})
	if sim.missing != "" {
		testenv.Missing(t, sim.missing, "run `make test`, which builds the control plane and installs iproute2, as root")
	}
	if sim.err != nil {
		t.Fatalf("start the simulated cluster: %v", sim.err)
	}
	return sim.c
}

// recorder records the API calls a client makes.
type recorder struct {
	mu    sync.Mutex
	calls []string
	rt    http.RoundTripper
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	verb := req.Method
	if req.URL.Query().Get("watch") == "true" {
		verb = "WATCH"
	}
	r.mu.Lock()
	r.calls = append(r.calls, verb+" "+req.URL.Path)
	r.mu.Unlock()
	return r.rt.RoundTrip(req)
}

// sequence is the calls with repeats in a row (a poll) folded into one,
// and the names replaced by what they stand for.
func (r *recorder) sequence(repl *strings.Replacer) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.calls {
		c = repl.Replace(c)
		if len(out) > 0 && out[len(out)-1] == c {
			continue
		}
		out = append(out, c)
	}
	return out
}

func recordingClient(t *testing.T, cfg *rest.Config) (kubernetes.Interface, *recorder) {
	rec := &recorder{}
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { rec.rt = rt; return rec }
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs, rec
}

// workload is the app a test migrates: a Deployment's or a StatefulSet's
// only pod on node A.
type workload struct {
	ns, owner string // owner: "Deployment" or "StatefulSet"
	pod       *corev1.Pod
	created   *podLog
}

func podTemplate(inject bool) corev1.PodTemplateSpec {
	ann := map[string]string{}
	if inject {
		ann[contract.AnnotationInject] = "true"
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "consumer"}, Annotations: ann},
		Spec: corev1.PodSpec{
			NodeName:                      nodeA,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "app", Image: "sim.test/consumer:1",
				Env: []corev1.EnvVar{{Name: "AMQP_URL", Value: "amqp://guest:guest@rabbitmq.default:5672/"}}}},
		},
	}
}

// deploy makes a namespace and the workload in it, and waits until its pod
// runs and has served for a while.
func deploy(t *testing.T, c *simcluster.Cluster, ns, owner string, injected bool) *workload {
	t.Helper()
	return deployWith(t, c, ns, owner, podTemplate(injected), nil)
}

// deployWith is deploy with the pod template tmpl, and before, if set,
// run once the namespace is made (to make what the pods refer to).
func deployWith(t *testing.T, c *simcluster.Cluster, ns, owner string, tmpl corev1.PodTemplateSpec, before func()) *workload {
	t.Helper()
	ctx := t.Context()
	if err := c.Namespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before()
	}
	t.Cleanup(func() {
		if err := c.Client.CoreV1().Namespaces().Delete(context.WithoutCancel(t.Context()), ns, metav1.DeleteOptions{}); err != nil {
			t.Logf("delete namespace %s: %v", ns, err)
		}
	})
	w := &workload{ns: ns, owner: owner, created: watchCreated(t, c.Client, ns)}
	one := int32(1)
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "consumer"}}
	var err error
	switch owner {
	case "Deployment":
		_, err = c.Client.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "consumer"},
			Spec:       appsv1.DeploymentSpec{Replicas: &one, Selector: sel, Template: tmpl},
		}, metav1.CreateOptions{})
	case "StatefulSet":
		_, err = c.Client.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Name: "consumer"},
			Spec:       appsv1.StatefulSetSpec{Replicas: &one, Selector: sel, Template: tmpl, ServiceName: "consumer"},
		}, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	var pods *corev1.PodList
	testenv.Eventually(t, time.Minute, "the "+owner+"'s pod runs on "+nodeA, func() bool {
		pods, err = c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 1 && pods.Items[0].Status.Phase == corev1.PodRunning
	})
	w.pod = &pods.Items[0]
	if evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil && os.Getenv("SIM_DEBUG") != "" {
		for _, e := range evs.Items {
			t.Logf("event %s %s: %s", e.Reason, e.InvolvedObject.Name, e.Message)
		}
	}
	time.Sleep(800 * time.Millisecond) // some deliveries before the migration
	return w
}

// podLog records every pod created in a namespace, in order.
type podLog struct {
	mu   sync.Mutex
	pods []*corev1.Pod
}

func watchCreated(t *testing.T, cs kubernetes.Interface, ns string) *podLog {
	l := &podLog{}
	ctx, cancel := context.WithCancel(t.Context())
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); w.Stop() })
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				l.mu.Lock()
				l.pods = append(l.pods, p)
				l.mu.Unlock()
			}
		}
	}()
	return l
}

func (l *podLog) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, p := range l.pods {
		out = append(out, p.Name)
	}
	return out
}

func (l *podLog) all() []*corev1.Pod {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.pods)
}

func resetNodes(c *simcluster.Cluster) {
	for _, n := range c.Nodes {
		n.Reset()
	}
	c.FailPushes(false)
	c.FailPushesOf("")
}

func env(c *simcluster.Cluster, cs kubernetes.Interface) migrate.Env {
	return migrate.Env{
		Client:     cs,
		Agent:      agent.Client{Resolve: agent.ByNodeIP(cs, simcluster.AgentPort), Token: c.AgentToken},
		ImageRepo:  c.ImageRepo(),
		SigningKey: c.SigningKey,
	}
}

func plan(w *workload, strategy contract.Strategy) migrate.Plan {
	target := "target-" + string(strategy)
	return migrate.Plan{
		Name: "m-" + string(strategy), Namespace: w.ns, Pod: w.pod.Name, Container: "app",
		TargetNode: nodeB, TargetPod: target, Strategy: strategy, ReplayMax: 2 * time.Second, Timeout: time.Minute,
	}
}

func TestStrategiesOnSimulatedNodes(t *testing.T) {
	c := cluster(t)
	for _, tc := range []struct {
		strategy contract.Strategy
		owner    string
	}{
		{contract.StrategyStopAndCopy, "Deployment"},
		{contract.StrategyMS2M, "Deployment"},
		{contract.StrategyMS2MCutoff, "Deployment"},
		{contract.StrategyStatefulSet, "StatefulSet"},
		{contract.StrategyStatefulSetShadow, "StatefulSet"},
	} {
		t.Run(string(tc.strategy), func(t *testing.T) {
			ns := "sim-" + string(tc.strategy)
			resetNodes(c)
			w := deploy(t, c, ns, tc.owner, true)
			cs, rec := recordingClient(t, c.Config)
			p := plan(w, tc.strategy)
			rep, err := migrate.Run(t.Context(), env(c, cs), p)
			if err != nil {
				t.Fatalf("migrate: %v", err)
			}
			t.Logf("%s: total %s, downtime %s, checkpoint %d, cutoff %d, phases %v", tc.strategy, rep.Total, rep.Downtime, rep.Start, rep.CutoffID, rep.Phases)

			final := checkServing(t, c, w, rep)
			checkPods(t, c, w, rep, final)
			// The images were in the namespace's repository, and went once
			// the target served: each is the process's memory.
			if !strings.HasPrefix(rep.Image, c.ImageRepo()+"/"+ns+"@sha256:") {
				t.Errorf("checkpoint image %s, want it in %s/%s", rep.Image, c.ImageRepo(), ns)
			}
			expectNoImage(t, rep.Image)
			expectNoImage(t, migrate.CheckpointRef(c.ImageRepo(), ns, p.Name, c.SigningKey))
			if rep.ShadowImage != "" {
				expectNoImage(t, rep.ShadowImage)
				expectNoImage(t, migrate.CheckpointRef(c.ImageRepo(), ns, migrate.ShadowName(p.Name), c.SigningKey))
			}
			repl := strings.NewReplacer(w.pod.Name, "{source}", "/namespaces/"+ns+"/", "/namespaces/{ns}/", "/"+ns+"/", "/{ns}/")
			golden(t, "calls/"+string(tc.strategy)+".txt", callLog(rec.sequence(repl), c, repl))
		})
	}
}

// checkServing checks that exactly one pod serves the log, on node B, with
// every delivery processed once, and returns it.
func checkServing(t *testing.T, c *simcluster.Cluster, w *workload, rep migrate.Report) *corev1.Pod {
	t.Helper()
	ctx := t.Context()
	target, err := c.Client.CoreV1().Pods(w.ns).Get(ctx, rep.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the target pod %s: %v", rep.TargetPod, err)
	}
	if target.Spec.NodeName != nodeB {
		t.Errorf("the target runs on %q, want %s", target.Spec.NodeName, nodeB)
	}
	sp := c.Nodes[nodeB].Pod(w.ns, target.Name)
	if sp == nil || sp.UID != target.UID {
		t.Fatalf("node %s does not run the target %s", nodeB, target.Name)
	}
	if !sp.Restored {
		t.Errorf("the target was not started from a checkpoint image")
	}
	if w.pod.Name != target.Name {
		if _, err := c.Client.CoreV1().Pods(w.ns).Get(ctx, w.pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the source %s is still there (err %v)", w.pod.Name, err)
		}
	}
	if src := c.Nodes[nodeA].Pod(w.ns, w.pod.Name); src != nil {
		t.Errorf("node %s still runs the source", nodeA)
	}
	// The target serves on: its app goes on processing the log's deliveries.
	before := sp.App.State().Last
	testenv.Eventually(t, 10*time.Second, "the target processes new deliveries", func() bool { return sp.App.State().Last > before+3 })
	st := sp.App.State()
	log := c.Log(inject.LogName(target)).LastID()
	if len(st.Violations) > 0 {
		t.Errorf("the app saw %d deliveries out of order: %v", len(st.Violations), st.Violations)
	}
	if st.Count != st.Last || st.Last+1 < log {
		t.Errorf("the app processed %d deliveries, the last %d; the log holds %d: want each of them once", st.Count, st.Last, log)
	}
	if sp.Sidecar.Mode() != simcluster.ModeServing {
		t.Errorf("the target's sidecar is %s, want serving", sp.Sidecar.Mode())
	}
	return target
}

// checkPods checks the pods made: the target is a restore of rep, owned by
// the workload's controller, and no pod ever started with empty state.
func checkPods(t *testing.T, c *simcluster.Cluster, w *workload, rep migrate.Report, target *corev1.Pod) {
	t.Helper()
	ctrl := metav1.GetControllerOf(target)
	wantKind := map[string]string{"Deployment": "ReplicaSet", "StatefulSet": "StatefulSet"}[w.owner]
	if ctrl == nil || ctrl.Kind != wantKind {
		t.Errorf("the target's controller is %v, want a %s", ctrl, wantKind)
	}
	var st inject.Status
	if err := json.Unmarshal([]byte(target.Annotations[contract.AnnotationStatus]), &st); err != nil || st.Restore == "" {
		t.Errorf("the target's %s does not name a restore: %q", contract.AnnotationStatus, target.Annotations[contract.AnnotationStatus])
	}
	app, image := target.Spec.Containers[0], rep.Image
	if rep.ShadowImage != "" {
		image = rep.ShadowImage // the StatefulSet's pod is restored from the shadow's checkpoint
	}
	if app.Image != image {
		t.Errorf("the target's app image is %s, want the checkpoint image %s", app.Image, image)
	}
	env := map[string]string{}
	for _, ic := range target.Spec.InitContainers {
		if ic.Name == inject.SidecarName {
			for _, e := range ic.Env {
				env[e.Name] = e.Value
			}
		}
	}
	start := rep.Start
	if rep.ShadowPod != "" {
		start = rep.ShadowCheckpoint
	}
	if env["MS2M_REPLAY_START"] != fmt.Sprint(start) {
		t.Errorf("the target's MS2M_REPLAY_START is %q, want %d", env["MS2M_REPLAY_START"], start)
	}
	wantCutoff := "marker"
	if rep.Strategy == contract.StrategyStopAndCopy || rep.Strategy == contract.StrategyStatefulSet {
		wantCutoff = fmt.Sprint(rep.CutoffID)
	}
	if got := env["MS2M_REPLAY_CUTOFF"]; got != wantCutoff && !(wantCutoff == "marker" && got == "") {
		t.Errorf("the target's MS2M_REPLAY_CUTOFF is %q, want %s", got, wantCutoff)
	}
	// Every pod made after the source is a restore: the source, the target
	// (and a shadow) and nothing else.
	want := []string{w.pod.Name}
	if rep.ShadowPod != "" {
		want = append(want, rep.ShadowPod)
	}
	want = append(want, target.Name)
	testenv.Eventually(t, 5*time.Second, "the pod watch catches up", func() bool { return len(w.created.names()) >= len(want) })
	if got := w.created.names(); !slices.Equal(got, want) {
		t.Errorf("pods created: %v, want %v", got, want)
	}
	for _, p := range w.created.all()[1:] {
		if _, ok := p.Annotations[contract.AnnotationStatus]; !ok || !strings.Contains(p.Annotations[contract.AnnotationStatus], `"restore"`) {
			t.Errorf("pod %s was created without a restore: it would start with empty state", p.Name)
		}
	}
	ctx := t.Context()
	switch w.owner {
	case "Deployment":
		rs, err := c.Client.AppsV1().ReplicaSets(w.ns).Get(ctx, ctrl.Name, metav1.GetOptions{})
		if err == nil && rs.Status.Replicas != 1 {
			t.Errorf("ReplicaSet %s has %d replicas, want 1", rs.Name, rs.Status.Replicas)
		}
	case "StatefulSet":
		if _, err := c.Client.CoreV1().ConfigMaps(w.ns).Get(ctx, contract.PendingConfigMapName(target.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the pending-migration ConfigMap is still there (err %v)", err)
		}
	}
}

// checkImage checks a checkpoint image's layout in the registry: one layer,
// the archive, uncompressed; linux on the agent's (this host's)
// architecture; both runtimes' annotations.
func checkImage(t *testing.T, image, container string) {
	t.Helper()
	ref, err := name.ParseReference(image, name.Insecure)
	if err != nil {
		t.Fatalf("checkpoint image %q: %v", image, err)
	}
	if _, ok := ref.(name.Digest); !ok {
		t.Errorf("checkpoint image %s is not by digest", image)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatalf("pull %s: %v", image, err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{ociimage.AnnotationCheckpointContainerd, ociimage.AnnotationCheckpointCRIO} {
		if m.Annotations[k] != container {
			t.Errorf("manifest annotation %s = %q, want %q", k, m.Annotations[k], container)
		}
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar" {
		t.Errorf("layers %+v, want one uncompressed OCI layer", m.Layers)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if want := ociimage.HostPlatform(); cfg.OS != want.OS || cfg.Architecture != want.Architecture {
		t.Errorf("config platform %s/%s, want %s", cfg.OS, cfg.Architecture, want)
	}
}

var timestamp = regexp.MustCompile(`-\d{4}-\d\d-\d\dT[0-9:.]+Z\.tar`)

// callLog is the API calls and then each node's kubelet and agent calls.
func callLog(api []string, c *simcluster.Cluster, repl *strings.Replacer) []string {
	out := append([]string{"# API server"}, api...)
	for _, n := range []string{nodeA, nodeB} {
		out = append(out, "# node "+n)
		var prev string
		for _, call := range c.Nodes[n].Calls() {
			call = timestamp.ReplaceAllString(repl.Replace(call), "-{time}.tar")
			if call != prev {
				out = append(out, call)
			}
			prev = call
		}
	}
	return out
}

func golden(t *testing.T, file string, lines []string) {
	t.Helper()
	path := filepath.Join("testdata", file)
	got := strings.Join(lines, "\n") + "\n"
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to write it)", err, t.Name())
	}
	if string(want) != got {
		t.Errorf("the calls differ from %s (rerun with -update if the change is meant):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

// TestAdaptiveCutoffOnSimulatedNodes: ms2m-cutoff with the adaptive rule
// stops the source once the target's backlog replays within T_replay_max at
// its live rate, and the migration stays exact.
func TestAdaptiveCutoffOnSimulatedNodes(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	w := deploy(t, c, "sim-adaptive", "Deployment", true)
	p := plan(w, contract.StrategyMS2MCutoff)
	p.Cutoff = contract.CutoffAdaptive
	// The target's replay is held until the source stops, so that it
	// cannot catch up: only the rule can stop the source, with a backlog.
	c.Nodes[nodeB].HoldReplays(true)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if sp := c.Nodes[nodeA].Pod(w.ns, w.pod.Name); sp != nil && sp.Sidecar.Mode() == simcluster.ModeStopped {
				c.Nodes[nodeB].HoldReplays(false)
				return
			}
		}
	}()
	rep, err := migrate.Run(t.Context(), env(c, c.Client), p)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if rep.Cutoff != contract.CutoffAdaptive || rep.Handover == nil {
		t.Fatalf("report: cutoff %q, handover %+v; want the adaptive rule's handover", rep.Cutoff, rep.Handover)
	}
	if rep.Handover.LagAtStop == 0 {
		t.Errorf("the source stopped with no backlog: the rule did not stop it early")
	}
	if budget := rep.Mu * p.ReplayMax.Seconds(); float64(rep.Handover.LagAtStop) > budget {
		t.Errorf("the source stopped %d deliveries ahead of the target: more than μ × T_replay_max = %.0f", rep.Handover.LagAtStop, budget)
	}
	t.Logf("adaptive: lag at stop %d, μ %.1f, T_cutoff %s, downtime %s", rep.Handover.LagAtStop, rep.Mu, rep.TCutoff, rep.Downtime)
	checkServing(t, c, w, rep)
}

// TestCheckpointThroughTheAPIServer: the opt-in fallback
// (Env.CheckpointThroughAPIServer, the chart's migrator.checkpointVia:
// apiserver) takes the checkpoint through the API server's node proxy, not
// the agent; by default the agent takes it and the proxy is never called.
func TestCheckpointThroughTheAPIServer(t *testing.T) {
	c := cluster(t)
	for _, viaAPIServer := range []bool{false, true} {
		t.Run(fmt.Sprintf("through the API server %v", viaAPIServer), func(t *testing.T) {
			resetNodes(c)
			ns := fmt.Sprintf("sim-via-%v", viaAPIServer)
			w := deploy(t, c, ns, "Deployment", true)
			cs, rec := recordingClient(t, c.Config)
			e := env(c, cs)
			e.CheckpointThroughAPIServer = viaAPIServer
			rep, err := migrate.Run(t.Context(), e, plan(w, contract.StrategyMS2M))
			if err != nil {
				t.Fatalf("migrate: %v", err)
			}
			checkServing(t, c, w, rep)
			proxied := slices.ContainsFunc(rec.sequence(strings.NewReplacer()), func(s string) bool {
				return strings.Contains(s, "/proxy/checkpoint/")
			})
			byAgent := slices.Contains(c.Nodes[nodeA].Calls(), "agent POST /v1/checkpoints")
			if proxied != viaAPIServer || byAgent == viaAPIServer {
				t.Errorf("through the node proxy: %v, by the agent: %v; want the proxy only with CheckpointThroughAPIServer (%v)", proxied, byAgent, viaAPIServer)
			}
		})
	}
}
