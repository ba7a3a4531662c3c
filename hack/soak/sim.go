package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/soak"
)

// simOptions are the sim mode's flags.
type simOptions struct {
	chunk  int
	assets string
	faults string
}

func (o *simOptions) register(fs *flag.FlagSet) {
	fs.IntVar(&o.chunk, "chunk", 25, "sim: migrations per chunk (one simulated cluster serves the whole run)")
	fs.StringVar(&o.assets, "assets", "", "sim: the folder with kube-apiserver, etcd and kube-controller-manager (default $KUBEBUILDER_ASSETS, else bin/k8s)")
	fs.StringVar(&o.faults, "faults", strings.Join(simFaults, ","), "sim: the faults to draw from, comma-separated (none is a migration without one)")
}

// The simulated cluster's nodes; the workloads move between them.
var simNodes = [2]string{"soak-a", "soak-b"}

// Faults of the sim mode. Each migration draws one (and its strategy,
// workload and timing) from the seed and its number.
const (
	faultNone           = "none"
	faultCheckpoint     = "checkpoint-fails"   // the source node's kubelet answers the checkpoint with a 500
	faultPush           = "push-refused"       // the registry refuses the checkpoint image
	faultRestore        = "restore-fails"      // the target's restore fails (CrashLoopBackOff)
	faultKillCheckpoint = "kill-in-checkpoint" // the controller killed (SIGKILL) while the kubelet checkpoints
	faultKillImage      = "kill-in-image"      // ... while the agent builds and pushes the image
	faultKillRestore    = "kill-in-restore"    // ... while the target is restored
	faultKillReplay     = "kill-in-replay"     // ... while the target replays
	faultKillSwitch     = "kill-after-switch"  // ... after the target took over (ms2m's source patch)
	faultAPIDelay       = "api-delay"          // the controller's writes to the API held 0.2-3 s
	faultAPIFail        = "api-writes-fail"    // the controller's writes to the API fail (500) for a window
	faultControlCut     = "control-cut"        // the target node's sidecar control APIs cut off for a window
	// The node's processes and the broker (simfaults.go).
	faultAgentCheckpoint = "agent-killed-checkpoint" // the source node's agent killed while the kubelet checkpoints, back after a window
	faultAgentImage      = "agent-killed-image"      // ... while it builds and pushes the image
	faultAgentPull       = "agent-killed-pull"       // the target node's agent killed while it pulls the app's image
	faultBroker          = "broker-restart"          // the broker away from every sidecar for a window, at a drawn moment
	faultBrokerReplay    = "broker-restart-replay"   // ... once the target replays
	faultKubeletSource   = "kubelet-stop-source"     // the source node's kubelet stopped for a window, at a drawn moment
	faultKubeletTarget   = "kubelet-stop-target"     // ... the target node's
	faultSourceApp       = "source-app-killed"       // the source's app killed after the checkpoint (a restored source: it comes back from its image)
	faultSourceSidecar   = "source-sidecar-killed"   // the source's sidecar killed for a window, at a drawn moment (a source that was not restored)
)

var simFaults = []string{faultNone, faultCheckpoint, faultPush, faultRestore, faultKillCheckpoint, faultKillImage,
	faultKillRestore, faultKillReplay, faultKillSwitch, faultAPIDelay, faultAPIFail, faultControlCut,
	faultAgentCheckpoint, faultAgentImage, faultAgentPull, faultBroker, faultBrokerReplay, faultKubeletSource,
	faultKubeletTarget, faultSourceApp, faultSourceSidecar}

// simWorkload is one workload the sim mode moves: a Deployment or a
// StatefulSet with one pod, in a namespace of its own.
type simWorkload struct {
	kind, ns string
}

// sim is the mode that migrates two workloads on the simulated cluster
// by annotation, through the real `migrator controller` (a process, its
// API calls through a gate), with a fault drawn per migration; the
// oracle is the simulated apps' record of every delivery (no gap, no
// duplicate, each once) and exactly one pod serving afterwards.
type sim struct {
	o        simOptions
	logs     string
	hard     context.Context // a migration's waits end with it
	say      func(format string, args ...any)
	tmp      string
	migrator string
	c        *simcluster.Cluster
	gate     *simcluster.APIGate
	ctl      *exec.Cmd
	ctlDone  chan struct{}
	ctlN     int
	faults   []string
	wl       map[string]*simWorkload
	wlN      int
}

func newSim(o simOptions, logs string, hard context.Context, stderr io.Writer) (*sim, error) {
	if o.chunk < 1 {
		return nil, fmt.Errorf("-chunk %d: want 1 or more", o.chunk)
	}
	s := &sim{o: o, logs: logs, hard: hard, wl: map[string]*simWorkload{}, say: func(format string, args ...any) {
		fmt.Fprintf(stderr, "%s soak: sim: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}}
	for _, f := range strings.Split(o.faults, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(simFaults, f) {
			return nil, fmt.Errorf("-faults: %q is not a fault; want some of %s", f, strings.Join(simFaults, ","))
		}
		s.faults = append(s.faults, f)
	}
	return s, nil
}

func (s *sim) Name() string { return "sim" }

// start brings the simulated cluster and the controller up, once.
func (s *sim) start() error {
	if s.c != nil {
		return nil
	}
	repo := cluster.FindRepo()
	if repo == "" {
		return errors.New("run the soak inside the ms2m repository (it builds cmd/migrator)")
	}
	assets := s.o.assets
	if assets == "" {
		assets = os.Getenv("KUBEBUILDER_ASSETS")
	}
	if assets == "" {
		assets = filepath.Join(repo, "bin", "k8s")
	}
	if m := simcluster.Missing(assets); m != "" {
		return fmt.Errorf("the simulated cluster needs %s", m)
	}
	var err error
	if s.tmp, err = os.MkdirTemp("", "ms2m-soak-sim-"); err != nil {
		return err
	}
	s.migrator = filepath.Join(s.tmp, "migrator")
	build := exec.Command("go", "build", "-o", s.migrator, "./cmd/migrator")
	build.Dir, build.Stdout, build.Stderr = repo, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build cmd/migrator: %w", err)
	}
	s.say("starting the simulated cluster")
	if s.c, err = simcluster.Start(simcluster.Options{Assets: assets, Nodes: simNodes[:], Logf: s.say}); err != nil {
		return fmt.Errorf("start the simulated cluster: %w", err)
	}
	if s.gate, err = s.c.NewGate(); err != nil {
		return err
	}
	return s.startController()
}

// startController starts a `migrator controller` through the gate.
func (s *sim) startController() error {
	s.ctlN++
	logFile, err := os.Create(filepath.Join(s.logs, fmt.Sprintf("sim-controller-%d.log", s.ctlN)))
	if err != nil {
		return err
	}
	cmd := exec.Command(s.migrator, "controller")
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+s.gate.Kubeconfig,
		"MS2M_IMAGE_REPO="+s.c.ImageRepo(),
		"MS2M_AGENT_TOKEN="+s.c.AgentToken,
		"MS2M_AGENT_PORT="+strconv.Itoa(simcluster.AgentPort),
		"MS2M_LEADER_ELECTION=false",
		"MS2M_METRICS_ADDR=0",
		"MS2M_HEALTH_ADDR=0",
		"MS2M_MIGRATION_TIMEOUT=1m",
		// The simulated cluster's key, which its webhook checks restores
		// with and writes control tokens by: one key, as the chart's Secret.
		"MS2M_STATUS_KEY="+string(s.c.SigningKey),
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start the controller: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logFile.Close(); close(done) }() // how it ended is in its log; a log that failed to close loses its tail only
	s.ctl, s.ctlDone = cmd, done
	return nil
}

// killController kills the controller at once, as a node loss does.
func (s *sim) killController() {
	select {
	case <-s.ctlDone:
	default:
		s.ctl.Process.Kill()
		<-s.ctlDone
	}
}

// Close takes the controller and the simulated cluster down.
func (s *sim) Close() error {
	var errs []error
	if s.ctl != nil {
		s.killController()
	}
	if s.gate != nil {
		errs = append(errs, s.gate.Close())
	}
	if s.c != nil {
		errs = append(errs, s.c.Close())
	}
	if s.tmp != "" {
		errs = append(errs, os.RemoveAll(s.tmp))
	}
	return errors.Join(errs...)
}

func (s *sim) Chunk(ctx context.Context, c soak.Chunk) error {
	if err := os.MkdirAll(s.logs, 0o755); err != nil {
		return err
	}
	if err := s.start(); err != nil {
		return err
	}
	for i := c.First; i < c.First+c.N; i++ {
		if ctx.Err() != nil {
			return nil
		}
		r, err := s.migrate(s.hard, c, i)
		if h := (errHarness{}); errors.As(err, &h) {
			return h.err
		}
		r.Index, r.Run, r.Seed, r.At = i, c.ID, c.Seed, time.Now().UTC()
		if aerr := soak.Append(c.Records, r); aerr != nil {
			return errors.Join(err, aerr)
		}
		s.say("%d: %s %s (%s → %s), %s: %s, %s %s", i, r.Workload, r.Strategy, r.From, r.To, r.Fault, r.Result, r.Outcome, r.Error)
		if err != nil {
			return err // the cluster itself failed
		}
	}
	return nil
}

// errHarness is an error of the simulated cluster before a migration
// began: it is not recorded as the migration's.
type errHarness struct{ err error }

func (e errHarness) Error() string { return e.err.Error() }
func (e errHarness) Unwrap() error { return e.err }

// draw is what migration i of a run draws from its seed.
type draw struct {
	kind     string
	strategy contract.Strategy
	fault    string
	delay    time.Duration // api-delay: how long; the windows' length
	after    time.Duration // api-writes-fail, control-cut: when the window opens
}

func (s *sim) draw(seed int64, i int) draw {
	r := rand.New(rand.NewPCG(uint64(seed), uint64(i)))
	d := draw{kind: "Deployment"}
	strategies := []contract.Strategy{contract.StrategyMS2M, contract.StrategyMS2MCutoff, contract.StrategyStopAndCopy}
	if r.IntN(2) == 1 {
		d.kind = "StatefulSet"
		strategies = []contract.Strategy{contract.StrategyStatefulSet, contract.StrategyStatefulSetShadow}
	}
	d.strategy = strategies[r.IntN(len(strategies))]
	d.fault = s.faults[r.IntN(len(s.faults))]
	if d.fault == faultKillSwitch && d.strategy != contract.StrategyMS2M && d.strategy != contract.StrategyMS2MCutoff {
		d.fault = faultKillRestore // the switch patch is ms2m's
	}
	d.delay = time.Duration(200+r.IntN(2800)) * time.Millisecond
	if d.fault == faultAPIFail || d.fault == faultControlCut || nodeFaults[d.fault] {
		d.delay = time.Duration(300+r.IntN(4700)) * time.Millisecond
	}
	d.after = time.Duration(r.IntN(800)) * time.Millisecond // a migration on the simulated nodes takes about that
	if d.fault == faultSourceSidecar {
		d.after /= 4 // a fresh workload's migration is quick: most kills at 0-0.8 s came after it
	}
	return d
}

// migrate runs migration i and checks it; its error says the simulated
// cluster itself failed, not the migration.
func (s *sim) migrate(ctx context.Context, c soak.Chunk, i int) (r soak.Record, err error) {
	d := s.draw(c.Seed, i)
	r = soak.Record{Mode: "sim", Strategy: string(d.strategy), Workload: d.kind, Fault: d.fault,
		Result: soak.Failed, Outcome: soak.Stuck}
	w, err := s.workload(ctx, d.kind)
	if err != nil {
		return r, err
	}
	if d.fault == faultSourceSidecar {
		if w, err = s.fresh(ctx, w); err != nil {
			return r, err
		}
	}
	pods := s.c.Client.CoreV1().Pods(w.ns)
	src, err := s.serving(ctx, w)
	if err != nil {
		// Before any migration: the simulated cluster is at fault, not
		// the migrator; nothing is recorded, and the chunk fails.
		s.replace(w)
		return r, errHarness{fmt.Errorf("before migration %d: %w", i, err)}
	}
	to := simNodes[0]
	if src.Spec.NodeName == to {
		to = simNodes[1]
	}
	r.From, r.To = src.Spec.NodeName, to
	seen := statusNames(ctx, s.c, w.ns)

	// Arm the fault.
	var reached <-chan struct{}
	var release, fire func()
	from, dst := s.c.Nodes[src.Spec.NodeName], s.c.Nodes[to]
	if nodeFaults[d.fault] {
		nf := s.armNodeFault(ctx, d, w, src, from, dst)
		defer func() {
			if nf.heal() {
				r.Fault += " (missed)"
			}
		}()
		reached, fire, release = nf.reached, nf.fire, nf.release
	}
	switch d.fault {
	case faultCheckpoint:
		from.Fail(simcluster.StepCheckpoint, simcluster.Failure{Code: http.StatusInternalServerError, Body: "soak: the checkpoint fails"})
	case faultPush:
		s.c.FailPushes(true)
	case faultRestore:
		dst.Fail(simcluster.StepRestore, simcluster.Failure{Body: "soak: the restore fails"})
	case faultKillCheckpoint:
		h := from.HoldStep(simcluster.StepCheckpoint)
		reached, release = h.Reached, h.Release
	case faultKillImage:
		h := from.HoldStep(simcluster.StepImage)
		reached, release = h.Reached, h.Release
	case faultKillRestore:
		h := dst.HoldStep(simcluster.StepRestore)
		reached, release = h.Reached, h.Release
	case faultKillReplay:
		dst.HoldReplays(true)
		ch := make(chan struct{})
		stop := make(chan struct{})
		go watchReplaying(dst, w.ns, ch, stop)
		reached, release = ch, func() { close(stop); dst.HoldReplays(false) }
	case faultKillSwitch:
		h := s.gate.HoldRequest(func(q simcluster.Request) bool {
			return q.Method == http.MethodPatch && strings.HasSuffix(q.Path, "/namespaces/"+w.ns+"/pods/"+src.Name) && bytes.Contains(q.Body, []byte(migrate.DeletionCostAnnotation))
		})
		reached, release = h.Reached, h.Release
	case faultAPIDelay:
		h := s.gate.HoldRequest(func(q simcluster.Request) bool {
			return q.Method != http.MethodGet && strings.Contains(q.Path, "/namespaces/"+w.ns+"/")
		})
		go func() {
			select {
			case <-h.Reached:
				time.Sleep(d.delay)
			case <-time.After(time.Minute):
			}
			h.Release()
		}()
		defer h.Release()
	case faultAPIFail, faultControlCut:
		done, hits := make(chan struct{}), make(chan int, 1)
		defer func() {
			close(done)
			if <-hits == 0 {
				r.Fault += " (missed)"
			}
		}()
		go func() {
			select {
			case <-done:
				hits <- 0
				return
			case <-time.After(d.after):
			}
			var undo func() int
			if d.fault == faultControlCut {
				undo = dst.CutControl()
			} else {
				undo = s.gate.FailRequests(func(q simcluster.Request) bool {
					return q.Method != http.MethodGet && strings.Contains(q.Path, "/namespaces/"+w.ns+"/")
				})
			}
			select {
			case <-done:
			case <-time.After(d.delay):
			}
			hits <- undo()
		}()
	}
	defer func() {
		if release != nil {
			release()
		}
		for _, n := range s.c.Nodes {
			n.Reset()
		}
		s.c.FailPushes(false)
	}()

	began := time.Now()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q,%q:"2s"}}}`,
		contract.AnnotationMigrateTo, to, contract.AnnotationStrategy, d.strategy, contract.AnnotationReplayMax)
	if _, err := pods.Patch(ctx, src.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		r.Error = "request the migration: " + err.Error()
		return r, nil
	}
	if reached != nil {
		killed := false
		for deadline := time.Now().Add(time.Minute); !killed && time.Now().Before(deadline); {
			select {
			case <-reached:
				if fire != nil {
					fire()
					release()
					release = nil
					killed = true
					break
				}
				s.killController()
				release()
				release = nil
				if err := s.startController(); err != nil {
					return r, err
				}
				killed = true
			case <-time.After(200 * time.Millisecond):
				if _, ended := endedStatus(ctx, s.c, w.ns, seen); ended {
					deadline = time.Time{} // it ended before the point
				}
			}
		}
		if !killed {
			r.Fault += " (missed)"
		}
	}
	st, ok := waitEnded(ctx, s.c, w.ns, seen, 3*time.Minute)
	r.TotalMS = float64(time.Since(began)) / float64(time.Millisecond)
	if !ok {
		r.Error = strings.TrimPrefix(r.Error+"; the migration did not end within 3 minutes", "; ")
		s.replace(w)
		return r, nil
	}
	if st.Report != nil {
		r.DowntimeMS = ms(st.Report.Downtime)
		if r.DowntimeMS < 0 { // seen once: kept as a finding, not as a figure
			r.Error = strings.TrimPrefix(fmt.Sprintf("%s; the report's downtime is negative (%s)", r.Error, st.Report.Downtime), "; ")
			r.DowntimeMS = 0
		}
	}
	var served *corev1.Pod
	served, r.Outcome, r.Checked, err = s.check(ctx, w)
	if err != nil {
		r.Error = strings.TrimPrefix(r.Error+"; "+err.Error(), "; ")
	}
	// The result is who serves: a new pod (completed) or the source
	// (rolled back), whatever the status says; where the two disagree,
	// the record says so.
	if served != nil {
		r.Result = soak.Completed
		if served.UID == src.UID {
			r.Result = soak.RolledBack
		}
		if want := map[soak.Result]contract.Phase{soak.Completed: contract.PhaseSucceeded}[r.Result]; (want == "") == (st.Phase == contract.PhaseSucceeded) {
			r.Error = strings.TrimPrefix(fmt.Sprintf("%s; the status says %s but %s serves", r.Error, st.Phase, served.Name), "; ")
		}
	}
	if r.Outcome != soak.Exact {
		s.replace(w) // its app's record is spoilt for the next migrations
		if st.Message != "" {
			r.Error = strings.TrimPrefix(r.Error+"; the status: "+st.Message, "; ")
		}
	}
	return r, nil
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// watchReplaying closes reached once a pod of ns on n replays.
func watchReplaying(n *simcluster.Node, ns string, reached, stop chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		for _, sp := range n.Pods(ns) {
			if sp.Sidecar.Mode() == simcluster.ModeReplaying {
				close(reached)
				return
			}
		}
	}
}

// statusNames are the migrations in the statuses of ns's pods, by name and
// start (statusKey): two requests of a pod within a second may get the
// same name.
func statusNames(ctx context.Context, c *simcluster.Cluster, ns string) map[string]bool {
	seen := map[string]bool{}
	list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return seen
	}
	for _, p := range list.Items {
		if st, err := controller.DecodeStatus(p.Annotations[contract.AnnotationMigrationStatus]); err == nil {
			seen[statusKey(st)] = true
		}
	}
	return seen
}

// statusKey tells migrations apart: their name and when they started.
func statusKey(st controller.Status) string {
	return st.Name + "@" + st.Started.UTC().Format(time.RFC3339Nano)
}

// waitEnded waits for a status in ns of a migration not in seen that has
// ended.
func waitEnded(ctx context.Context, c *simcluster.Cluster, ns string, seen map[string]bool, limit time.Duration) (controller.Status, bool) {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		if st, ok := endedStatus(ctx, c, ns, seen); ok {
			return st, true
		}
	}
	return controller.Status{}, false
}

// endedStatus is waitEnded's look at the pods, once.
func endedStatus(ctx context.Context, c *simcluster.Cluster, ns string, seen map[string]bool) (controller.Status, bool) {
	list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return controller.Status{}, false
	}
	for _, p := range list.Items {
		v, ok := p.Annotations[contract.AnnotationMigrationStatus]
		if !ok {
			continue
		}
		st, err := controller.DecodeStatus(v)
		if err == nil && !seen[statusKey(st)] && st.Phase != contract.PhaseRunning && st.Phase != "" {
			return st, true
		}
	}
	return controller.Status{}, false
}

// serving waits until w has one pod, running, whose simulated sidecar
// serves, and returns it.
func (s *sim) serving(ctx context.Context, w *simWorkload) (*corev1.Pod, error) {
	var last string
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		list, err := s.c.Client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
		switch {
		case err != nil:
			last = err.Error()
		case len(list.Items) != 1:
			last = fmt.Sprintf("%d pods", len(list.Items))
		case list.Items[0].Status.Phase != corev1.PodRunning || list.Items[0].DeletionTimestamp != nil:
			last = "the pod does not run"
		default:
			p := &list.Items[0]
			sp := s.c.Nodes[p.Spec.NodeName].Pod(w.ns, p.Name)
			if sp != nil && sp.UID == p.UID && sp.Sidecar.Mode() == simcluster.ModeServing {
				return p, nil
			}
			last = "its sidecar does not serve"
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("no single serving pod of the %s in %s within a minute: %s", w.kind, w.ns, last)
}

// check is the oracle after a migration ended: one pod serves, exactly
// one simulated sidecar of the workload serves, and its app has processed
// each delivery of the log once, in order, and goes on processing.
func (s *sim) check(ctx context.Context, w *simWorkload) (*corev1.Pod, soak.Outcome, int, error) {
	p, err := s.serving(ctx, w)
	if err != nil {
		return nil, soak.Stuck, 0, err
	}
	o, n, err := s.checkApp(w, p)
	return p, o, n, err
}

// checkApp is check's part on the serving pod p.
func (s *sim) checkApp(w *simWorkload, p *corev1.Pod) (soak.Outcome, int, error) {
	sp := s.c.Nodes[p.Spec.NodeName].Pod(w.ns, p.Name)
	// Exactly one serves, for a while: a second one would take deliveries
	// of the same log.
	for n := 0; n < 10; n++ {
		serving := 0
		for _, node := range s.c.Nodes {
			for _, o := range node.Pods(w.ns) {
				if o.Sidecar.Mode() == simcluster.ModeServing {
					serving++
				}
			}
		}
		if serving > 1 {
			return soak.Doubled, int(sp.App.State().Count), fmt.Errorf("%d pods of the %s serve at once", serving, w.kind)
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := sp.App.State().Last
	deadline := time.Now().Add(10 * time.Second)
	for sp.App.State().Last <= before+3 {
		if time.Now().After(deadline) {
			return soak.Stuck, int(sp.App.State().Count), fmt.Errorf("%s processes nothing new", p.Name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	st := sp.App.State()
	logLast := s.c.Log(inject.LogName(p)).LastID()
	for _, v := range st.Violations {
		if strings.HasPrefix(v, "duplicate") {
			return soak.Doubled, int(st.Count), fmt.Errorf("%s: %s", p.Name, strings.Join(st.Violations, "; "))
		}
	}
	switch {
	case len(st.Violations) > 0:
		return soak.Lost, int(st.Count), fmt.Errorf("%s: %s", p.Name, strings.Join(st.Violations, "; "))
	case st.Count > st.Last:
		return soak.Doubled, int(st.Count), fmt.Errorf("%s processed %d deliveries, the last %d", p.Name, st.Count, st.Last)
	case st.Count < st.Last || st.Last+1 < logLast:
		return soak.Lost, int(st.Count), fmt.Errorf("%s processed %d deliveries, the last %d; the log holds %d", p.Name, st.Count, st.Last, logLast)
	}
	return soak.Exact, int(st.Count), nil
}

// workload returns the workload of kind, made on first use.
func (s *sim) workload(ctx context.Context, kind string) (*simWorkload, error) {
	if w := s.wl[kind]; w != nil {
		return w, nil
	}
	s.wlN++
	w := &simWorkload{kind: kind, ns: fmt.Sprintf("soak-%s-%d", strings.ToLower(kind), s.wlN)}
	if err := s.c.Namespace(ctx, w.ns); err != nil {
		return nil, err
	}
	one := int32(1)
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "consumer"}}
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "consumer"}, Annotations: map[string]string{contract.AnnotationInject: "true"}},
		Spec: corev1.PodSpec{
			NodeName:                      simNodes[0],
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "app", Image: "sim.test/consumer:1",
				Env: []corev1.EnvVar{{Name: "AMQP_URL", Value: "amqp://guest:guest@rabbitmq.default:5672/"}}}},
		},
	}
	var err error
	switch kind {
	case "Deployment":
		_, err = s.c.Client.AppsV1().Deployments(w.ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "consumer"},
			Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: sel, Template: tmpl}}, metav1.CreateOptions{})
	default:
		_, err = s.c.Client.AppsV1().StatefulSets(w.ns).Create(ctx, &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "consumer"},
			Spec: appsv1.StatefulSetSpec{Replicas: &one, Selector: sel, Template: tmpl, ServiceName: "consumer"}}, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("create the %s in %s: %w", kind, w.ns, err)
	}
	s.wl[kind] = w
	return w, nil
}

// replace drops w: the next migration of its kind starts a fresh one.
// The namespace stays, for a look at what went wrong.
func (s *sim) replace(w *simWorkload) {
	if s.wl[w.kind] == w {
		delete(s.wl, w.kind)
	}
}
