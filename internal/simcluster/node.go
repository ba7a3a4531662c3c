package simcluster

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/ociimage"
)

// Ports of a simulated node, on its address.
const (
	KubeletPort = 10250
	AgentPort   = 8090
)

// Step names the node's steps that a test can fail or hold.
type Step string

const (
	// StepCheckpoint is the kubelet's checkpoint call.
	StepCheckpoint Step = "checkpoint"
	// StepImage is the agent's image build and push.
	StepImage Step = "image"
	// StepStart is a pod becoming Running on the node.
	StepStart Step = "start"
	// StepRestore is a restored pod becoming Running; failing it leaves
	// the pod's app container in CrashLoopBackOff, as a failed CRIU
	// restore does.
	StepRestore Step = "restore"
	// StepPull is the agent's pull of the app's image on the target.
	StepPull Step = "pull"
)

// Failure is what an armed step answers: an HTTP status and body for the
// kubelet and the agent, a message for a restore.
type Failure struct {
	Code int
	Body string
}

// Node is a simulated node.
type Node struct {
	Name string
	IP   string
	// CheckpointDir is the kubelet's checkpoint folder, which the agent
	// reads archives from.
	CheckpointDir string

	c    *Cluster
	mu   sync.Mutex
	fail map[Step]Failure
	// failOf: the kubelet's checkpoint of these containers fails
	// (FailCheckpointOf).
	failOf map[string]Failure
	holds  map[Step]*Hold
	pods   map[types.UID]*SimPod
	// holdReplays: targets that start now start with their replay held.
	holdReplays bool
	// controlCut: the pods' control APIs drop every connection
	// (CutControl); dropped counts the requests dropped.
	controlCut bool
	dropped    int
	// cutOn: the cut starts at the first request to this path
	// (CutControlOn).
	cutOn string
	// holdAfter: targets that start now hold their replay after this
	// many records (HoldReplaysAfter).
	holdAfter uint64
	// degrade, if set, changes what the node's agent reports it can do
	// (Degrade).
	degrade  func(*contract.NodeCapabilities)
	oldAgent bool // the agent answers GET /v1/node with 404, as one before it
	// images are the checkpoint images the node has pulled, as a node's
	// runtime keeps them: a restart or a new restore on the node finds
	// them after the migration deleted them from the registry.
	images map[string]AppState
	calls  []string // kubelet and agent requests, in order
	pulls  []string
	// pullAuths are the pulls' credentials, in the order of pulls.
	pullAuths []*contract.RegistryAuth
	// base is the node's context; the pod loop runs under stop and done
	// (StopKubelet ends it).
	base context.Context
	stop context.CancelFunc
	done chan struct{}
	// The kubelet's and the agent's servers, and what a restart serves
	// again (StopKubelet, KillAgent).
	ksrv, asrv     *http.Server
	kubeletTLS     *tls.Config
	kubeletCA      *x509.CertPool
	agentStop      context.CancelFunc // the agent's janitor
	kubeletStopped bool
	agentKilled    bool
}

// SimPod is a pod the node runs: its address, sidecar and app.
type SimPod struct {
	Namespace, Name string
	UID             types.UID
	IP              string
	Sidecar         *Sidecar
	App             *App
	// Apps are the apps of the pod's app containers by name (a whole pod
	// has several), App among them.
	Apps       map[string]*App
	Restored   bool // started from a checkpoint image
	srv        *http.Server
	stateReads atomic.Int64
	// sidecarDown: the sidecar container is dead (KillSidecar), its
	// control API drops every request.
	sidecarDown atomic.Bool
	// starting is set (under Node.mu) while run starts the pod: a pod
	// gone meanwhile is stopped by run once it is done, so that its
	// address returns to the pool only after its listener is closed.
	starting bool
}

// StateReads is how many times the pod's sidecar answered GET /state: a
// migrator that reads it has got as far as watching the pod.
func (p *SimPod) StateReads() int64 { return p.stateReads.Load() }

// Hold makes a step wait: Reached is closed when the step has begun, and
// the step goes on once Release is called.
type Hold struct {
	Reached chan struct{}
	release chan struct{}
	once    sync.Once
	rel     sync.Once
}

// Release lets the held step go on.
func (h *Hold) Release() { h.rel.Do(func() { close(h.release) }) }

func (h *Hold) wait(ctx context.Context) {
	h.once.Do(func() { close(h.Reached) })
	select {
	case <-h.release:
	case <-ctx.Done():
	}
}

// Fail arms a step to fail with f until Fail(step, Failure{}) disarms it.
func (n *Node) Fail(step Step, f Failure) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f == (Failure{}) {
		delete(n.fail, step)
		return
	}
	n.fail[step] = f
}

// FailCheckpointOf arms the kubelet's checkpoint of container (in any
// pod) to fail with f until FailCheckpointOf(container, Failure{})
// disarms it: one container of a whole pod fails.
func (n *Node) FailCheckpointOf(container string, f Failure) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f == (Failure{}) {
		delete(n.failOf, container)
		return
	}
	if n.failOf == nil {
		n.failOf = map[string]Failure{}
	}
	n.failOf[container] = f
}

// HoldStep makes the next occurrences of step wait until the hold is
// released.
func (n *Node) HoldStep(step Step) *Hold {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := newHold()
	n.holds[step] = h
	return h
}

func newHold() *Hold { return &Hold{Reached: make(chan struct{}), release: make(chan struct{})} }

// HoldReplays holds (true) the replay of every target that starts on the
// node from now on, and releases (false) the ones held: they stay in
// replay mode with what they replayed so far.
func (n *Node) HoldReplays(on bool) {
	n.mu.Lock()
	n.holdReplays = on
	var held []*Sidecar
	for _, sp := range n.pods {
		if sp.Sidecar != nil {
			held = append(held, sp.Sidecar)
		}
	}
	n.mu.Unlock()
	if !on {
		for _, s := range held {
			s.Hold(false)
		}
	}
}

// CutControl cuts the network between the pods' control APIs on the node
// and everyone else until restore is called: meanwhile every request is
// dropped, its connection closed without an answer, as a lost route does
// to a request in flight. restore says how many were dropped.
func (n *Node) CutControl() (restore func() int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.controlCut, n.dropped = true, 0
	return func() int {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.controlCut = false
		return n.dropped
	}
}

// CutControlOn cuts the network as CutControl does, from the first
// request to path (that one dropped too) until restore is called, so that
// a test can cut a given step, say a migrator's POST /quiesce.
func (n *Node) CutControlOn(path string) (restore func() int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cutOn, n.dropped = path, 0
	return func() int {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.controlCut, n.cutOn = false, ""
		return n.dropped
	}
}

// Dropped is how many control requests the node's cut has dropped so far.
func (n *Node) Dropped() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dropped
}

func (n *Node) cut(path string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cutOn != "" && path == n.cutOn {
		n.controlCut, n.cutOn = true, ""
	}
	if n.controlCut {
		n.dropped++
	}
	return n.controlCut
}

// dropConn closes the connection of w's request without an answer.
func dropConn(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler) // the server closes the connection
}

// gate applies what is armed for step: it waits on a hold, then returns
// the failure, if any.
func (n *Node) gate(ctx context.Context, step Step) (Failure, bool) {
	n.mu.Lock()
	h := n.holds[step]
	n.mu.Unlock()
	if h != nil {
		h.wait(ctx)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	f, ok := n.fail[step]
	return f, ok
}

// Pods returns the pods the node runs in namespace ns.
func (n *Node) Pods(ns string) []*SimPod {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*SimPod
	for _, sp := range n.pods {
		if sp.Namespace == ns && sp.Sidecar != nil {
			out = append(out, sp)
		}
	}
	return out
}

// Calls returns the kubelet and agent requests the node served, in order.
func (n *Node) Calls() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.calls...)
}

// Pulls returns the images the agent was asked to pull.
func (n *Node) Pulls() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.pulls...)
}

// Pod returns the simulated pod ns/name, or nil.
func (n *Node) Pod(ns, name string) *SimPod {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.pods {
		if p.Namespace == ns && p.Name == name {
			return p
		}
	}
	return nil
}

func (n *Node) record(s string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls = append(n.calls, s)
}

// Pull implements agent.Puller: the image is recorded, and must exist in
// the cluster's registry when it is one of its images.
func (n *Node) Pull(ctx context.Context, ref string, auth *contract.RegistryAuth) error {
	if f, ok := n.gate(ctx, StepPull); ok {
		return errors.New(f.Body)
	}
	if ctx.Err() != nil {
		return ctx.Err() // killed (KillAgent) while held
	}
	n.mu.Lock()
	n.pulls = append(n.pulls, ref)
	n.pullAuths = append(n.pullAuths, auth)
	n.mu.Unlock()
	return nil
}

// PullAuths returns the credentials each pull was given (nil: none), in
// the order of Pulls.
func (n *Node) PullAuths() []*contract.RegistryAuth {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*contract.RegistryAuth(nil), n.pullAuths...)
}

// Degrade changes what the node's agent reports that its node can do
// (GET /v1/node): f edits a capable node's report, e.g. to turn restore
// off or CRIU away. Nil, or Reset, makes the node capable again.
func (n *Node) Degrade(f func(*contract.NodeCapabilities)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.degrade = f
}

// OldAgent makes the node's agent one from before GET /v1/node: it
// answers 404 there. Reset undoes it.
func (n *Node) OldAgent(on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.oldAgent = on
}

// Probe is the node's report for its agent: a capable node, unless
// Degrade changed it.
func (n *Node) Probe(context.Context) contract.NodeCapabilities {
	yes, on := true, true
	restore := true
	c := contract.NodeCapabilities{
		Runtime: "sim", RuntimeVersion: "1", CRIUFound: &yes, CRIU: "sim",
		CheckpointEnabled: &on, RestoreEnabled: &restore, CgroupVersion: 2,
	}
	n.mu.Lock()
	f := n.degrade
	n.mu.Unlock()
	if f != nil {
		f(&c)
	}
	return c
}

// start brings the node up: its Node object, its kubelet and agent, and
// the loop that runs the pods bound to it.
func (n *Node) start(ctx context.Context) error {
	if err := n.register(ctx); err != nil {
		return err
	}
	cert, kubeletCA, err := servingCert(n.IP)
	if err != nil {
		return err
	}
	n.kubeletTLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	if err := n.serveKubelet(); err != nil {
		return err
	}
	n.kubeletCA, n.base = kubeletCA, ctx
	if err := n.serveAgent(); err != nil {
		return err
	}
	n.startPods()
	return nil
}

// register creates the Node object, Ready, without the not-ready taint.
func (n *Node) register(ctx context.Context) error {
	c := n.c
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{corev1.LabelHostname: n.Name}},
	}
	created, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	now := metav1.Now()
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("16Gi"), corev1.ResourcePods: resource.MustParse("110")}
	created.Status = corev1.NodeStatus{
		Capacity: res, Allocatable: res,
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IP}, {Type: corev1.NodeHostName, Address: n.IP}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: KubeletPort}},
		Conditions:      []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}},
		NodeInfo:        corev1.NodeSystemInfo{KubeletVersion: "v1.37.2-sim", ContainerRuntimeVersion: "sim://1", OperatingSystem: "linux", Architecture: "amd64"},
	}
	ready, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("node %s status: %w", n.Name, err)
	}
	// The apiserver taints a new node node.kubernetes.io/not-ready
	// (TaintNodesByCondition); the node lifecycle controller, which this
	// cluster does not run, removes the taint once the node is Ready.
	var taints []corev1.Taint
	for _, t := range ready.Spec.Taints {
		if t.Key != corev1.TaintNodeNotReady {
			taints = append(taints, t)
		}
	}
	if len(taints) != len(ready.Spec.Taints) {
		ready.Spec.Taints = taints
		if _, err := c.Client.CoreV1().Nodes().Update(ctx, ready, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("node %s: remove the not-ready taint: %w", n.Name, err)
		}
	}
	return nil
}

// serveKubelet serves the kubelet's API on the node's address.
func (n *Node) serveKubelet() error {
	kl, err := n.c.ns.listen(net.JoinHostPort(n.IP, strconv.Itoa(KubeletPort)))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(n.kubelet), TLSConfig: n.kubeletTLS, ReadHeaderTimeout: 10 * time.Second}
	n.mu.Lock()
	n.ksrv = srv
	n.mu.Unlock()
	go srv.ServeTLS(kl, "", "")
	return nil
}

// ArchiveGrace is the simulated agents' agent.Config.ArchiveGrace: an
// archive no image was built from goes after 2 s, not half an hour.
const ArchiveGrace = 2 * time.Second

// newAgent makes the node's real agent, wrapped in the faults a test can
// arm: its API, as the node serves it on AgentPort. Its archive janitor
// runs until ctx ends.
func (n *Node) newAgent(ctx context.Context, kubeletCA *x509.CertPool) (http.Handler, error) {
	c := n.c
	// The agent asks its own kubelet for checkpoints, with a token that
	// the simulated kubelet takes as it comes.
	tokenFile := filepath.Join(filepath.Dir(n.CheckpointDir), "agent-sa-token")
	if err := os.WriteFile(tokenFile, []byte("sim-agent-sa-token"), 0o600); err != nil {
		return nil, err
	}
	kubelet := &agent.Kubelet{URL: "https://" + net.JoinHostPort(n.IP, strconv.Itoa(KubeletPort)), TokenFile: tokenFile,
		HTTP: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: kubeletCA, MinVersion: tls.VersionTLS12}}}}
	as, err := agent.NewServer(agent.Config{
		NodeName: n.Name, Kubelet: kubelet,
		CheckpointDir: n.CheckpointDir, Token: c.AgentToken, Push: ociimage.PushOptions{Insecure: true}, Repository: c.ImageRepo(),
		Puller: n, Node: n, Logger: slog.New(slog.DiscardHandler), ArchiveGrace: ArchiveGrace,
	})
	if err != nil {
		return nil, err
	}
	go as.SweepArchives(ctx)
	ah := as.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.record("agent " + r.Method + " " + r.URL.Path)
		n.mu.Lock()
		old := n.oldAgent
		n.mu.Unlock()
		if old && r.URL.Path == "/v1/node" {
			http.NotFound(w, r)
			return
		}
		if r.Method == http.MethodPost && r.URL.Path == "/v1/checkpoint-images" {
			if f, ok := n.gate(r.Context(), StepImage); ok {
				http.Error(w, `{"error":`+strconv.Quote(f.Body)+`}`, f.Code)
				return
			}
		}
		if r.Context().Err() != nil {
			return // killed (KillAgent) while held: a dead agent does nothing more
		}
		ah.ServeHTTP(w, r)
	}), nil
}

// serveAgent starts a new agent (a new process: KillAgent kills the one
// before) and serves its API on the node's address.
func (n *Node) serveAgent() error {
	ctx, stop := context.WithCancel(n.base)
	h, err := n.newAgent(ctx, n.kubeletCA)
	if err != nil {
		stop()
		return err
	}
	al, err := n.c.ns.listen(net.JoinHostPort(n.IP, strconv.Itoa(AgentPort)))
	if err != nil {
		stop()
		return err
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: h}
	srv.RegisterOnShutdown(stop)
	n.mu.Lock()
	n.asrv, n.agentStop = srv, stop
	n.mu.Unlock()
	go srv.Serve(al)
	return nil
}

// startPods starts the loop that runs the pods bound to the node, the
// kubelet's part (StopKubelet stops it).
func (n *Node) startPods() {
	ctx, stop := context.WithCancel(n.base)
	done := make(chan struct{})
	n.mu.Lock()
	n.stop, n.done = stop, done
	n.mu.Unlock()
	go func() {
		defer close(done)
		n.runPods(ctx)
	}()
}

// kubelet answers the checkpoint API the way the kubelet does: POST
// /checkpoint/{ns}/{pod}/{container} writes an archive into the checkpoint
// folder and answers {"items":[path]}.
func (n *Node) kubelet(w http.ResponseWriter, r *http.Request) {
	n.record("kubelet " + r.Method + " " + r.URL.Path)
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method != http.MethodPost || len(parts) != 4 || parts[0] != "checkpoint" {
		http.Error(w, "404 page not found", http.StatusNotFound)
		return
	}
	ns, podName, container := parts[1], parts[2], parts[3]
	if f, ok := n.gate(r.Context(), StepCheckpoint); ok {
		http.Error(w, f.Body, f.Code)
		return
	}
	n.mu.Lock()
	f, failed := n.failOf[container]
	n.mu.Unlock()
	if failed {
		http.Error(w, f.Body, f.Code)
		return
	}
	p := n.Pod(ns, podName)
	if p == nil {
		http.Error(w, fmt.Sprintf("pod %s/%s not found on node %s", ns, podName, n.Name), http.StatusNotFound)
		return
	}
	app := p.App
	if a, ok := p.Apps[container]; ok {
		app = a
	}
	path := filepath.Join(n.CheckpointDir, fmt.Sprintf("checkpoint-%s_%s-%s-%s.tar", podName, ns, container, time.Now().UTC().Format("2006-01-02T15:04:05.000000000Z")))
	if err := writeArchive(path, ns, podName, container, app.State()); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string][]string{"items": {path}}) // the client's to read; nothing to do if it went
}

// writeArchive writes a checkpoint archive: a tar with the files a CRIU
// checkpoint has at its top (status.dump with the kubelet's labels, as
// containerd writes it, which the agent reads the namespace from), and the
// app's state.
func writeArchive(path, ns, podName, container string, app AppState) error {
	b, err := encodeApp(app)
	if err != nil {
		return err
	}
	status, err := json.Marshal(map[string]any{"metadata": map[string]string{"name": container}, "labels": map[string]string{
		"io.kubernetes.pod.namespace": ns, "io.kubernetes.pod.name": podName, "io.kubernetes.container.name": container}})
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	files := []struct {
		name string
		data []byte
	}{
		{"config.dump", []byte(`{"containerName":` + strconv.Quote(container) + `}`)},
		{"spec.dump", []byte(`{"ociVersion":"1.2.0"}`)},
		{"status.dump", status},
		{"checkpoint/inventory.img", []byte("simulated CRIU inventory")},
		{archiveAppFile, b},
	}
	for _, e := range files {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o600, Size: int64(len(e.data)), Typeflag: tar.TypeReg}); err != nil {
			f.Close()
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			f.Close()
			return err
		}
	}
	return errors.Join(tw.Close(), f.Close())
}

// runPods runs the pods bound to the node until ctx ends.
func (n *Node) runPods(ctx context.Context) {
	sel := fields.OneTermEqualSelector("spec.nodeName", n.Name).String()
	for ctx.Err() == nil {
		if err := n.forgetGone(ctx, sel); err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		w, err := n.c.Client.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			switch {
			case ev.Type == watch.Deleted:
				n.gone(pod.UID)
			case pod.DeletionTimestamp != nil:
				n.gone(pod.UID)
				// The kubelet's part of a graceful delete: the pod's
				// containers have stopped, so it goes at once.
				uid := pod.UID
				err := n.c.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &uid}})
				if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
					n.c.logf("node %s: delete pod %s/%s: %v", n.Name, pod.Namespace, pod.Name, err)
				}
			default:
				n.mu.Lock()
				_, known := n.pods[pod.UID]
				n.mu.Unlock()
				if !known && pod.Status.PodIP == "" {
					go n.run(n.base, pod) // a pod being started is started, even if the loop stops meanwhile
				}
			}
		}
		w.Stop()
	}
}

// forgetGone stops the pods that were deleted while nobody watched (the
// kubelet was stopped, or its watch broke), as a kubelet that starts
// kills the containers of pods it no longer finds.
func (n *Node) forgetGone(ctx context.Context, sel string) error {
	list, err := n.c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return err
	}
	there := map[types.UID]bool{}
	for _, p := range list.Items {
		there[p.UID] = true
	}
	n.mu.Lock()
	var gone []types.UID
	for uid, p := range n.pods {
		if !there[uid] && !p.starting {
			gone = append(gone, uid)
		}
	}
	n.mu.Unlock()
	for _, uid := range gone {
		n.gone(uid)
	}
	return nil
}

// gone stops a pod's simulation.
func (n *Node) gone(uid types.UID) {
	n.mu.Lock()
	p := n.pods[uid]
	delete(n.pods, uid)
	starting := p != nil && p.starting
	n.mu.Unlock()
	if p == nil || starting {
		return
	}
	n.stopPod(p)
}

// stopPod closes a gone pod's sidecar and listener and returns its address.
func (n *Node) stopPod(p *SimPod) {
	if p.Sidecar != nil {
		p.Sidecar.close()
	}
	if p.srv != nil {
		p.srv.Close()
	}
	if p.IP != "" {
		n.c.ns.give(p.IP)
	}
}

// run starts pod: its app from the checkpoint image if it is a restore,
// its sidecar as its MS2M_* variables say, and its status.
func (n *Node) run(ctx context.Context, pod *corev1.Pod) {
	n.mu.Lock()
	if _, ok := n.pods[pod.UID]; ok {
		n.mu.Unlock()
		return
	}
	sp := &SimPod{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, App: &App{}, starting: true}
	n.pods[pod.UID] = sp
	n.mu.Unlock()

	err := n.startPod(ctx, pod, sp)
	n.mu.Lock()
	sp.starting = false
	gone := n.pods[pod.UID] != sp
	n.mu.Unlock()
	if gone {
		n.stopPod(sp)
		return
	}
	if err != nil {
		n.c.logf("node %s: pod %s/%s: %v", n.Name, pod.Namespace, pod.Name, err)
		n.setFailed(ctx, pod, err.Error())
	}
}

func (n *Node) startPod(ctx context.Context, pod *corev1.Pod, sp *SimPod) error {
	if f, ok := n.gate(ctx, StepStart); ok {
		return errors.New(f.Body)
	}
	names := inject.AppContainers(pod)
	if len(names) == 0 {
		return errors.New("no app container")
	}
	apps, imageIDs := []*App{sp.App}, map[string]string{}
	sp.Apps = map[string]*App{names[0]: sp.App}
	for i, name := range names {
		if i > 0 {
			apps = append(apps, &App{})
			sp.Apps[name] = apps[i]
		}
		apps[i].part, apps[i].parts = uint64(i), uint64(len(names))
		app := container(pod, name)
		if _, ok := pod.Annotations[contract.AnnotationStatus]; ok && strings.HasPrefix(app.Image, n.c.RegistryHost+"/") {
			if i == 0 {
				if f, ok := n.gate(ctx, StepRestore); ok {
					return errors.New(f.Body)
				}
			}
			st, err := n.checkpointImage(ctx, app.Image)
			if err != nil {
				return fmt.Errorf("restore from %s: %w", app.Image, err)
			}
			apps[i].state, sp.Restored, imageIDs[name] = st, true, app.Image
		} else {
			sum := sha256.Sum256([]byte(app.Image))
			imageIDs[name] = "sim.test/app@sha256:" + hex.EncodeToString(sum[:])
		}
	}

	ip, err := n.c.ns.take()
	if err != nil {
		return err
	}
	sp.IP = ip
	env := sidecarEnv(pod)
	if env != nil {
		rp, err := replayOf(env)
		if err != nil {
			return err
		}
		n.mu.Lock()
		held, holdAfter := n.holdReplays, n.holdAfter
		n.mu.Unlock()
		sp.Sidecar = newSidecar(n.c.log(inject.LogName(pod)), apps, rp, held, holdAfter, &n.c.broker)
		port, token, err := migrate.SidecarGiven(ctx, n.c.Client, pod)
		if err != nil {
			return err
		}
		ln, err := n.c.ns.listen(net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		h := control.Handler(sp.Sidecar, token, prometheus.NewRegistry())
		sp.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n.cut(r.URL.Path) || sp.sidecarDown.Load() {
				dropConn(w)
				return
			}
			if r.URL.Path == "/state" {
				sp.stateReads.Add(1)
			}
			h.ServeHTTP(w, r)
		})}
		go sp.srv.Serve(ln)
	} else {
		sp.Sidecar = newSidecar(n.c.log(pod.Namespace+"/"+pod.Name), apps, nil, false, 0, &n.c.broker)
	}
	return n.setRunning(ctx, pod, ip, imageIDs)
}

// container is pod's container named name, nil if none.
func container(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	return nil
}

// sidecarEnv returns the literal variables of the pod's ms2m sidecar, or
// nil without one.
func sidecarEnv(pod *corev1.Pod) map[string]string {
	for _, c := range pod.Spec.InitContainers {
		if c.Name != inject.SidecarName {
			continue
		}
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		return env
	}
	return nil
}

// replayOf reads MS2M_REPLAY_*: nil for a sidecar that serves.
func replayOf(env map[string]string) (*Replay, error) {
	start, ok := env["MS2M_REPLAY_START"]
	if !ok {
		return nil, nil
	}
	var rp Replay
	var err error
	if rp.Start, err = strconv.ParseUint(start, 10, 64); err != nil {
		return nil, fmt.Errorf("MS2M_REPLAY_START %q: %w", start, err)
	}
	if c := env["MS2M_REPLAY_CUTOFF"]; c == "end" {
		rp.ToEnd = true
	} else if c != "" && c != "marker" {
		if rp.Cutoff, err = strconv.ParseUint(c, 10, 64); err != nil {
			return nil, fmt.Errorf("MS2M_REPLAY_CUTOFF %q: %w", c, err)
		}
	}
	if e := env["MS2M_REPLAY_EPOCH"]; e != "" {
		if rp.Epoch, err = strconv.ParseUint(e, 10, 64); err != nil {
			return nil, fmt.Errorf("MS2M_REPLAY_EPOCH %q: %w", e, err)
		}
	}
	return &rp, nil
}

func (n *Node) setRunning(ctx context.Context, pod *corev1.Pod, ip string, imageIDs map[string]string) error {
	now := metav1.Now()
	st := corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, HostIP: n.IP, StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
	started := true
	for _, c := range pod.Spec.InitContainers {
		sum := sha256.Sum256([]byte(c.Image))
		st.InitContainerStatuses = append(st.InitContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "sim.test/sidecar@sha256:" + hex.EncodeToString(sum[:]),
			Ready: true, Started: &started, State: running, ContainerID: "sim://" + string(pod.UID) + "/" + c.Name,
		})
	}
	for _, c := range pod.Spec.Containers {
		id, ok := imageIDs[c.Name]
		if !ok {
			sum := sha256.Sum256([]byte(c.Image))
			id = "sim.test/other@sha256:" + hex.EncodeToString(sum[:])
		}
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: id, Ready: true, Started: &started, State: running,
			ContainerID: "sim://" + string(pod.UID) + "/" + c.Name,
		})
	}
	return n.updateStatus(ctx, pod, st)
}

// setFailed reports pod's app container in CrashLoopBackOff with msg, as
// the kubelet does for a restore that fails each time.
func (n *Node) setFailed(ctx context.Context, pod *corev1.Pod, msg string) {
	st := corev1.PodStatus{Phase: corev1.PodPending, HostIP: n.IP}
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, RestartCount: 3,
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off restarting failed container " + c.Name}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "StartError", Message: msg}},
		})
	}
	if err := n.updateStatus(ctx, pod, st); err != nil && ctx.Err() == nil {
		n.c.logf("node %s: status of %s/%s: %v", n.Name, pod.Namespace, pod.Name, err)
	}
}

func (n *Node) updateStatus(ctx context.Context, pod *corev1.Pod, st corev1.PodStatus) error {
	for {
		cur, err := n.c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return nil // replaced meanwhile
		}
		cur.Status = st
		_, err = n.c.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// restoreState reads the app's state out of a checkpoint image in the
// cluster's registry: the layer is the archive the kubelet wrote.
func (c *Cluster) restoreState(ctx context.Context, image string) (AppState, error) {
	ref, err := name.ParseReference(image, name.Insecure)
	if err != nil {
		return AppState{}, err
	}
	img, err := remote.Image(ref, remote.WithContext(ctx))
	if err != nil {
		return AppState{}, fmt.Errorf("pull: %w", err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		return AppState{}, fmt.Errorf("a checkpoint image has one layer, this one %d (%v)", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		return AppState{}, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return AppState{}, fmt.Errorf("the archive has no %s", archiveAppFile)
		}
		if err != nil {
			return AppState{}, err
		}
		if h.Name == archiveAppFile {
			b, err := io.ReadAll(tr)
			if err != nil {
				return AppState{}, err
			}
			return decodeApp(b)
		}
	}
}

func (n *Node) close() {
	n.mu.Lock()
	stop, done, srvs := n.stop, n.done, []*http.Server{n.ksrv, n.asrv}
	n.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	for _, s := range srvs {
		if s != nil {
			s.Close()
		}
	}
	n.mu.Lock()
	uids := make([]types.UID, 0, len(n.pods))
	for uid := range n.pods {
		uids = append(uids, uid)
	}
	n.mu.Unlock()
	for _, uid := range uids {
		n.gone(uid)
	}
}

// Reset forgets the calls and pulls recorded so far, disarms every
// failure and hold, and starts a stopped kubelet and a killed agent again:
// a test starts with a clean node.
func (n *Node) Reset() {
	n.mu.Lock()
	n.calls, n.pulls, n.pullAuths = nil, nil, nil
	n.fail, n.failOf = map[Step]Failure{}, nil
	for _, h := range n.holds {
		h.Release()
	}
	n.holds = map[Step]*Hold{}
	n.holdReplays = false
	n.controlCut, n.cutOn = false, ""
	n.degrade, n.oldAgent = nil, false
	n.holdAfter = 0
	kubelet, agent := n.kubeletStopped, n.agentKilled
	n.mu.Unlock()
	if kubelet {
		if err := n.StopKubelet()(); err != nil {
			n.c.logf("node %s: start the kubelet again: %v", n.Name, err)
		}
	}
	if agent {
		if err := n.KillAgent()(); err != nil {
			n.c.logf("node %s: start the agent again: %v", n.Name, err)
		}
	}
}

// HoldReplaysAfter makes every target that starts on the node from now on
// hold its replay once it has replayed k records (0: no such hold); the
// ones that run already are released from theirs.
func (n *Node) HoldReplaysAfter(k uint64) {
	n.mu.Lock()
	n.holdAfter = k
	var running []*Sidecar
	for _, sp := range n.pods {
		if sp.Sidecar != nil {
			running = append(running, sp.Sidecar)
		}
	}
	n.mu.Unlock()
	if k == 0 {
		for _, s := range running {
			s.HoldAfter(0)
		}
	}
}

// RestartApp restarts the app container of pod ns/name, as the kubelet
// does after it exited: a restored pod's app comes back from its
// checkpoint image (the state it was restored with), any other empty. Its
// sidecar goes on.
func (n *Node) RestartApp(ctx context.Context, ns, name string) error {
	return n.RestartContainer(ctx, ns, name, "")
}

// RestartContainer is RestartApp for the app container named container of
// a whole pod ("": the first).
func (n *Node) RestartContainer(ctx context.Context, ns, name, cname string) error {
	sp := n.Pod(ns, name)
	if sp == nil {
		return fmt.Errorf("node %s runs no pod %s/%s", n.Name, ns, name)
	}
	var st AppState
	pod, err := n.c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if pod.UID != sp.UID {
		return fmt.Errorf("pod %s/%s was replaced meanwhile", ns, name)
	}
	if cname == "" {
		cname = inject.AppContainer(pod)
	}
	a, c := sp.Apps[cname], container(pod, cname)
	if a == nil || c == nil {
		return fmt.Errorf("pod %s/%s has no app container %s", ns, name, cname)
	}
	if sp.Restored && strings.HasPrefix(c.Image, n.c.RegistryHost+"/") {
		if st, err = n.checkpointImage(ctx, c.Image); err != nil {
			return err
		}
	}
	a.mu.Lock()
	a.state = st
	a.mu.Unlock()
	if sp.Sidecar != nil {
		sp.Sidecar.appRestarted()
	}
	// The kubelet reports the restart: a higher restartCount and a new
	// container ID.
	app := cname
	s := *pod.Status.DeepCopy()
	for i := range s.ContainerStatuses {
		if cs := &s.ContainerStatuses[i]; cs.Name == app {
			cs.RestartCount++
			cs.ContainerID = fmt.Sprintf("sim://%s/%s-%d", pod.UID, app, cs.RestartCount)
			cs.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error", Message: "restarted by the test"}}
		}
	}
	return n.updateStatus(ctx, pod, s)
}

// checkpointImage is the app state in checkpoint image, from the node's
// images or else pulled from the cluster's registry.
func (n *Node) checkpointImage(ctx context.Context, image string) (AppState, error) {
	n.mu.Lock()
	st, ok := n.images[image]
	n.mu.Unlock()
	if ok {
		st.Violations = append([]string(nil), st.Violations...)
		return st, nil
	}
	st, err := n.c.restoreState(ctx, image)
	if err != nil {
		return st, err
	}
	n.mu.Lock()
	n.images[image] = st
	n.mu.Unlock()
	return st, nil
}

// Kill kills the containers of pod ns/name, as a crash that keeps them
// from starting again does: its sidecar and app stop (the control API
// does not answer), and the pod reports them in CrashLoopBackOff, not
// ready. The pod object stays until it is deleted.
func (n *Node) Kill(ctx context.Context, ns, name string) error {
	sp := n.Pod(ns, name)
	if sp == nil {
		return fmt.Errorf("node %s runs no pod %s/%s", n.Name, ns, name)
	}
	if sp.Sidecar != nil {
		sp.Sidecar.close()
	}
	if sp.srv != nil {
		sp.srv.Close()
	}
	pod, err := n.c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if pod.UID != sp.UID {
		return fmt.Errorf("pod %s/%s was replaced meanwhile", ns, name)
	}
	st := *pod.Status.DeepCopy()
	for i := range st.Conditions {
		if st.Conditions[i].Type == corev1.PodReady || st.Conditions[i].Type == corev1.ContainersReady {
			st.Conditions[i].Status = corev1.ConditionFalse
		}
	}
	waiting := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "killed by the test"}}
	for _, list := range [][]corev1.ContainerStatus{st.InitContainerStatuses, st.ContainerStatuses} {
		for i := range list {
			list[i].Ready, list[i].State, list[i].RestartCount = false, waiting, list[i].RestartCount+1
		}
	}
	return n.updateStatus(ctx, pod, st)
}
