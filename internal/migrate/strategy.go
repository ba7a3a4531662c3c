package migrate

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/pullsecret"
)

// ByOwner is the strategy auto picks for pod.
func ByOwner(pod *corev1.Pod) contract.Strategy {
	if ownedByStatefulSet(pod) {
		return contract.StrategyStatefulSetShadow
	}
	return contract.StrategyMS2M
}

// NodeAgent does the node-local steps. The migrator's agent does them on
// each node; a local cluster, whose nodes share the host's file system, can
// do them in-process.
type NodeAgent interface {
	// BuildCheckpointImage turns a checkpoint archive on node into an image,
	// pushes it as ref (a tag), and returns it by digest (repo@sha256:...):
	// pods refer to it by digest, so that a node never restores a stale
	// image that had the same tag.
	BuildCheckpointImage(ctx context.Context, node, archive, container, ref string) (string, error)
	// PullImage makes ref (name@digest) present on node. A restore needs
	// the image the checkpoint is based on, and the runtime's restore path
	// pulls it without the node's registry configuration (containerd's
	// default resolver), so it is pulled ahead, the way pods pull theirs:
	// with auth, the credentials for ref's registry among the pod's
	// imagePullSecrets (nil: none, the node's own apply).
	PullImage(ctx context.Context, node, ref string, auth *contract.RegistryAuth) error
}

// Checkpointer is an optional NodeAgent method: it has node's kubelet
// checkpoint container of pod ns/pod (the node agent asks its own
// kubelet, with nodes/checkpoint), and returns the archive's path on the
// node. An agent without it, or Env.CheckpointThroughAPIServer, takes the
// checkpoint through the API server's node proxy (Checkpoint).
type Checkpointer interface {
	Checkpoint(ctx context.Context, node, ns, pod, container string, timeout time.Duration) (string, error)
}

// ImageDeleter is an optional NodeAgent method: it deletes a checkpoint
// image that node's agent pushed, so that a failed migration leaves none.
type ImageDeleter interface {
	DeleteCheckpointImage(ctx context.Context, node, ref string) error
}

// LogReader is an optional NodeAgent method: it returns the end of a file
// on node, so that a failed checkpoint's error can quote CRIU's own log.
type LogReader interface {
	ReadLog(ctx context.Context, node, path string) (string, error)
}

// Env is what the steps need from the cluster.
type Env struct {
	Client kubernetes.Interface
	// Agent does the node-local steps.
	Agent NodeAgent
	// CheckpointThroughAPIServer takes checkpoints through the API
	// server's node proxy (which needs nodes/proxy), even where Agent is a
	// Checkpointer: for clusters whose agents cannot reach their kubelet.
	CheckpointThroughAPIServer bool
	// ImageRepo is the repository checkpoint images go below, as the nodes
	// pull them (host:port/path): each namespace's to ImageRepo/<namespace>,
	// tagged with the migration's name and a secret part (CheckpointRef).
	ImageRepo string
	// KeepImages keeps a migration's checkpoint images in the registry
	// once its target serves (for debugging); by default they are deleted
	// then, as after a failure.
	KeepImages bool
	// Admit, if set, does to a pod what the webhook would, before it is
	// created: for clusters without the webhook (tests). Nil leaves it to
	// the webhook.
	Admit func(*corev1.Pod) (*corev1.Pod, error)
	// ControlToken, if set, is the sidecars' control token; empty: each
	// pod's namespace's, derived from SigningKey (control.TokenFor), as
	// the webhook gives it. ControlPort is their control port (default
	// 8089).
	ControlToken string
	ControlPort  int
	// SigningKey signs each restore instruction (the target pod's restore
	// annotations, a StatefulSet pod's pending record): the controller's
	// key, which the webhook checks them with. Without the webhook's key
	// the webhook refuses the target.
	SigningKey []byte
	// RestoreValidity is how long a signed restore instruction stays valid.
	// Default inject.DefaultRestoreValidity.
	RestoreValidity time.Duration
	// HTTP talks to the sidecars. Default: a client with a 10 s timeout.
	HTTP *http.Client
	// Progress, if set, hears each phase as it ends.
	Progress func(phase string, took time.Duration)
	// ReadRetry bounds how long failed reads of a target's sidecar are
	// retried once the source was asked to stop: in the handover, and again
	// before a failed migration decides whether its target took over.
	// Default control.DefaultReadRetry.
	ReadRetry time.Duration
	// Timeouts bound the steps that do not wait for a pod; zero fields
	// take DefaultTimeouts.
	Timeouts Timeouts
	// Clock tells the time for the report's timings and the deadlines.
	// Default: the system's clock.
	Clock Clock
	// Log hears each phase, with the migration's name. Default: none.
	Log logr.Logger
}

// Plan is one migration.
type Plan struct {
	Name      string // the migration's name; the checkpoint image's tag
	Namespace string
	Pod       string // the source pod
	// Container is the app container: the first of the pod's app
	// containers (inject.AppContainers), or the one ms2m.io/container
	// names. The pod's other app containers, if any, are checkpointed and
	// restored with it (Report.Images).
	Container  string
	TargetNode string
	TargetPod  string // the new pod's name
	Strategy   contract.Strategy
	// MaxLag is how far behind the target may be when the source is
	// stopped (ms2m). Default 0: the target has replayed everything.
	MaxLag uint64
	// ReplayMax is T_replay_max for MS2MCutoff. Default 5 s.
	ReplayMax time.Duration
	// Cutoff is MS2MCutoff's stop rule. Default CutoffFormula.
	Cutoff contract.CutoffRule
	// Timeout bounds each wait. Default 3 minutes.
	Timeout time.Duration
	// HoldWholeCall keeps a live checkpoint's hold on the source's
	// deliveries for the kubelet's whole checkpoint call. Default (false):
	// the hold ends as soon as the node's agent sees the app frozen
	// (FreezeWatcher; see ARCHITECTURE.md, "Hold until frozen"), and only
	// without a watch, or if it sees no freeze, at the call's end.
	HoldWholeCall bool
	// PullAhead has the target node's agent pull the checkpoint image
	// as soon as the target pod is created, while the kubelet sets the
	// pod up (sandbox, sidecar, probes), instead of leaving the pull to
	// the kubelet when it comes to the app container (copy strategies;
	// pullahead.go). Default off.
	PullAhead bool
	// ThawAfterDump says when the node's agent thaws the app as soon as
	// CRIU's dump is done rather than when the runtime resumes it, after
	// archiving the root filesystem's changes. Default ThawAuto: only an
	// app container with a read-only root filesystem (ARCHITECTURE.md,
	// "Thaw after the dump").
	ThawAfterDump ThawPolicy
}

// Report is what a migration measured.
type Report struct {
	Strategy contract.Strategy `json:"strategy"`
	Total    time.Duration     `json:"total"`
	Downtime time.Duration     `json:"downtime"`
	CutoffID uint64            `json:"cutoffId,omitempty"`
	Start    uint64            `json:"checkpointId"`
	Epoch    uint64            `json:"epoch,omitempty"` // the log's epoch at the checkpoint
	Phases   []Phase           `json:"phases"`
	Archive  string            `json:"archive"`
	Image    string            `json:"image"`
	// Images are the checkpoint images of the pod's app containers after
	// Plan.Container (a whole pod), by container; ShadowImages the
	// shadow's (statefulset-shadow).
	Images       map[string]string `json:"images,omitempty"`
	ShadowImages map[string]string `json:"shadowImages,omitempty"`
	TargetPod    string            `json:"targetPod"`
	Handover     *control.Timings  `json:"handover,omitempty"`
	// Cutoff strategy: the rates it was sized with, and T_cutoff.
	Cutoff  contract.CutoffRule `json:"cutoff,omitempty"`
	Lambda  float64             `json:"lambda,omitempty"`
	Mu      float64             `json:"mu,omitempty"`
	TCutoff time.Duration       `json:"tCutoff,omitempty"`
	// statefulset-shadow: the shadow pod, its checkpoint, and its handoff
	// to the StatefulSet's recreated pod (Handover is the first one; the
	// downtime is the sum of both).
	ShadowPod        string           `json:"shadowPod,omitempty"`
	ShadowCheckpoint uint64           `json:"shadowCheckpointId,omitempty"`
	ShadowImage      string           `json:"shadowImage,omitempty"`
	ShadowHandover   *control.Timings `json:"shadowHandover,omitempty"`
	// Hold breaks down the live checkpoint's hold (ms2m, ms2m-cutoff);
	// ShadowHold the shadow's (statefulset-shadow).
	Hold       *HoldTimings `json:"hold,omitempty"`
	ShadowHold *HoldTimings `json:"shadowHold,omitempty"`
	// Parts splits the checkpoint and restore phases of a copy migration
	// (ms2m, ms2m-cutoff, stop-and-copy, criu-alone) that ended well into
	// what the real components report (parts.go); nil otherwise.
	Parts *Parts `json:"parts,omitempty"`
	// Note says what the migrator had to find out on its own: a handover
	// that failed after the target had taken over, which it completed.
	Note string `json:"note,omitempty"`
	// Unchecked says which node the preflight could not check, and why
	// (its agent did not answer GET /v1/node: an older agent): the
	// migration went on without it.
	Unchecked []string `json:"unchecked,omitempty"`
	// Warnings are what went wrong after the target took over without
	// failing the migration (its restore annotations left, say).
	Warnings []string `json:"warnings,omitempty"`
	// Skipped (a rebuild) is how many deliveries its replay left out:
	// the broker had requeued them when the app left without acking them.
	Skipped int `json:"skipped,omitempty"`
}

// Refused is the error of a migration that Run refused before it touched
// anything: bad input, or a source that cannot be migrated now.
type Refused struct{ Err error }

func (e *Refused) Error() string { return e.Err.Error() }
func (e *Refused) Unwrap() error { return e.Err }

// AfterTakeover is the error of a migration whose target took over (it
// serves the primary queue) but whose last steps failed: handing the
// target to the workload's controller, or deleting the source. As far as
// the messages go, the migration is done; what failed is housekeeping,
// which Finish does again.
type AfterTakeover struct{ Err error }

func (e *AfterTakeover) Error() string { return e.Err.Error() }
func (e *AfterTakeover) Unwrap() error { return e.Err }

// Phase is one timed step.
type Phase struct {
	Name string        `json:"name"`
	Took time.Duration `json:"took"`
}

// Run migrates p.Pod to p.TargetNode by p.Strategy. On a failure before the
// handover, the source is resumed and keeps serving, and a target pod that
// was created is deleted.
func Run(ctx context.Context, env Env, p Plan) (Report, error) {
	r := newRun(env, p)
	r.log.Info("migration started", "strategy", p.Strategy, "targetNode", p.TargetNode, "targetPod", p.TargetPod)
	err := r.do(ctx)
	if err == nil {
		r.dropServedImages(ctx)
	}
	r.rep.Total = r.now().Sub(r.began)
	if err == nil && r.target != nil {
		r.measureParts(ctx)
	}
	if err != nil {
		r.log.Info("migration failed", "took", r.rep.Total, "err", err.Error())
	} else {
		r.log.Info("migration succeeded", "took", r.rep.Total, "downtime", r.rep.Downtime)
	}
	return r.rep, err
}

// newRun fills in env's and p's defaults.
func newRun(env Env, p Plan) *run {
	env.Timeouts = env.Timeouts.withDefaults()
	if env.HTTP == nil {
		env.HTTP = &http.Client{Timeout: env.Timeouts.Sidecar}
	}
	if env.ControlPort == 0 {
		env.ControlPort = 8089
	}
	if env.ReadRetry <= 0 {
		env.ReadRetry = control.DefaultReadRetry
	}
	if env.Clock == nil {
		env.Clock = SystemClock
	}
	if env.RestoreValidity <= 0 {
		env.RestoreValidity = inject.DefaultRestoreValidity
	}
	if env.Log.GetSink() == nil {
		env.Log = discard
	}
	if p.Timeout == 0 {
		p.Timeout = env.Timeouts.Wait
	}
	log := env.Log.WithValues("migration", p.Name, "pod", p.Namespace+"/"+p.Pod)
	return &run{env: env, p: p, rep: Report{Strategy: p.Strategy, TargetPod: p.TargetPod}, began: env.Clock.Now(), log: log}
}

type run struct {
	env    Env
	p      Plan
	rep    Report
	began  time.Time
	last   time.Time
	source *corev1.Pod
	log    logr.Logger
	// others are the source's app containers after Plan.Container,
	// checkpointed and restored with it (a whole pod); archives their
	// checkpoint archives of the last checkpoint.
	others   []string
	archives map[string]string
	// undo are the steps that take back what the phases so far did,
	// oldest first (undo.go).
	undo []undoStep
	// stopAsked: the source was asked to stop, so a target may have
	// taken over even if the migration failed (afterStop).
	stopAsked bool
	// pushedBefore: images of this migration may have been pushed by a
	// migrator that stopped, so dropServedImages tries them all.
	pushedBefore bool
	// For Report.Parts: a copy's target once it ran, and CRIU's dump of
	// a checkpoint outside a hold (stop-and-copy, criu-alone) as the
	// node's agent saw it, or why it did not.
	target   *corev1.Pod
	criuDump time.Duration
	noDump   string
	// Plan.PullAhead: the agent's pull of the checkpoint image on the
	// target node, and how long it took or why it failed.
	pulledAhead func() (time.Duration, string)
	ahead       time.Duration
	noAhead     string
}

func (r *run) now() time.Time { return r.env.Clock.Now() }

func (r *run) phase(name string) {
	now := r.now()
	if r.last.IsZero() {
		r.last = r.began
	}
	took := now.Sub(r.last)
	r.last = now
	r.rep.Phases = append(r.rep.Phases, Phase{Name: name, Took: took})
	r.log.Info("phase ended", "phase", name, "took", took)
	if r.env.Progress != nil {
		r.env.Progress(name, took)
	}
}

func (r *run) endpoint(pod *corev1.Pod) control.Client {
	token := r.env.ControlToken
	if token == "" {
		token = control.TokenFor(r.env.SigningKey, pod.Namespace)
	}
	return control.ClientAt(pod.Status.PodIP, r.env.ControlPort, token, r.env.HTTP)
}

func (r *run) do(ctx context.Context) error {
	p, cs := r.p, r.env.Client
	src, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Pod, metav1.GetOptions{})
	if err != nil {
		return &Refused{fmt.Errorf("migration %s: the source pod: %w", p.Name, err)}
	}
	if r.p.Strategy == contract.StrategyAuto || r.p.Strategy == "" {
		r.p.Strategy = ByOwner(src)
		r.rep.Strategy = r.p.Strategy
	}
	if err := preconditions(ctx, cs, src, r.p); err != nil {
		return &Refused{fmt.Errorf("migration %s: %w", p.Name, err)}
	}
	if err := r.sidecarServes(ctx, src); err != nil {
		return &Refused{fmt.Errorf("migration %s: %w", p.Name, err)}
	}
	// The nodes are asked last: bad input is refused without calling them.
	if err := r.preflight(ctx, src.Spec.NodeName); err != nil {
		return &Refused{fmt.Errorf("migration %s: %w", p.Name, err)}
	}
	r.source, r.others = src, otherApps(src, p.Container)
	r.phase("preconditions")

	for _, c := range append([]string{p.Container}, r.others...) {
		if err := r.pullBase(ctx, src, c); err != nil {
			return fmt.Errorf("migration %s: %w", p.Name, err)
		}
	}
	r.phase("prepare target")

	switch r.p.Strategy {
	case contract.StrategyStatefulSet:
		return r.statefulSet(ctx)
	case contract.StrategyStatefulSetShadow:
		return r.statefulSetShadow(ctx)
	}
	return r.podCopy(ctx)
}

// pullBase pulls the image app container c of src runs from on the
// target node, with the pod's own pull secret for the image's registry, as
// the kubelet pulled it on the source node.
func (r *run) pullBase(ctx context.Context, src *corev1.Pod, c string) error {
	base := imageID(src, c)
	if base == "" {
		return fmt.Errorf("pod %s/%s reports no image ID for container %s", src.Namespace, src.Name, c)
	}
	auth, unreadable, err := pullsecret.ForPod(ctx, r.env.Client, src, base)
	if err != nil {
		return fmt.Errorf("pull the app's image %s on the target node %s: %w", base, r.p.TargetNode, err)
	}
	if err := r.env.Agent.PullImage(ctx, r.p.TargetNode, base, auth); err != nil {
		if len(unreadable) > 0 {
			err = fmt.Errorf("%w (the migrator may not read the pod's imagePullSecrets %s: list their names in the chart's migrator.pullSecretNames, docs/security.md)", err, strings.Join(unreadable, ", "))
		}
		return fmt.Errorf("pull the app's image %s on the target node %s: %w", base, r.p.TargetNode, err)
	}
	return nil
}

// podCopy migrates by a copy of the source under a new name (ms2m,
// ms2m-cutoff, stop-and-copy, criu-alone), as phases (undo.go). Until the
// target has taken over, a failure takes back what was done: the half-made
// target goes, the checkpoint images go, and the source serves again. Once
// the source was asked to stop, the target may have taken over even if
// the migration failed (a read of it failed, the migrator's context
// ended): that is found out first (afterStop), and a target that took
// over, or that cannot be read, is never deleted.
func (r *run) podCopy(ctx context.Context) error {
	p, src := r.p, r.source
	srcEP := r.endpoint(src)
	// What the phases learn and later ones use.
	var (
		stopped control.StopResult
		running *corev1.Pod
	)
	checkpoint, err := r.copyCheckpoint(srcEP, &stopped)
	if err != nil {
		return err
	}
	phases := append(checkpoint,
		phase{name: "create target", do: func(ctx context.Context) error {
			restore := Restore{Migration: p.Name, Image: r.rep.Image, Images: r.rep.Images, Node: p.TargetNode, LogName: inject.LogName(src), Start: r.rep.Start, Epoch: r.rep.Epoch}
			if p.Strategy == contract.StrategyStopAndCopy {
				restore = restore.atStop(r.rep.CutoffID, r.rep.Epoch)
			}
			if err := r.createTarget(ctx, src, restore); err != nil {
				return err
			}
			if p.PullAhead {
				r.pulledAhead = r.pullAhead(ctx)
			}
			return nil
		}, undo: []undoStep{r.undoTarget(p.TargetPod)}},
		phase{name: "restore", do: func(ctx context.Context) (err error) {
			if running, err = waitRunning(ctx, r.env.Clock, r.env.Client, p.Namespace, p.TargetPod, p.Timeout); err != nil {
				return fmt.Errorf("the restore failed: %w", err)
			}
			r.phase("restore")
			r.target = running
			if r.pulledAhead != nil {
				r.ahead, r.noAhead = r.pulledAhead()
			}
			return nil
		}},
		r.copyTakeover(srcEP, &running, &stopped),
		phase{name: "took over", do: func(context.Context) error { r.commit(); return nil }},
		phase{name: "finalise", do: func(ctx context.Context) error {
			r.checkSourceStopped(ctx, srcEP) // before its controller may delete it
			if err := handBack(ctx, r.env.Clock, r.env.Client, src, p.TargetPod, p.Timeout); err != nil {
				return &AfterTakeover{fmt.Errorf("the target serves, but: %w", err)}
			}
			r.served(ctx, p.TargetPod)
			if err := deleteNow(ctx, r.env.Client, src); err != nil {
				return &AfterTakeover{fmt.Errorf("the target serves, but deleting the source %s failed: %w", p.Pod, err)}
			}
			r.phase("finalise")
			return nil
		}})
	return r.runPhases(ctx, phases...)
}

// copyCheckpoint are the phases up to the checkpoint image of a copy
// strategy: a live checkpoint (ms2m, ms2m-cutoff), a stop at a cutoff and a
// checkpoint (stop-and-copy, which sets stopped), or a checkpoint alone
// (criu-alone).
func (r *run) copyCheckpoint(srcEP control.Client, stopped *control.StopResult) ([]phase, error) {
	p, src := r.p, r.source
	switch p.Strategy {
	case contract.StrategyMS2M, contract.StrategyMS2MCutoff:
		return []phase{{name: "live checkpoint", do: func(ctx context.Context) error {
			cut, err := r.liveCheckpoint(ctx, src, p.Name, "")
			if err != nil {
				return err
			}
			r.rep.Start, r.rep.Epoch = cut.ID, cut.Epoch
			return nil
		}, undo: []undoStep{r.undoResume(srcEP), r.undoImages()}}}, nil
	case contract.StrategyStopAndCopy:
		return []phase{
			{name: "stop", do: func(ctx context.Context) (err error) {
				if *stopped, err = srcEP.Stop(ctx, r.env.Timeouts.Stop); err != nil {
					return err
				}
				r.stopAsked = true
				r.rep.Start, r.rep.CutoffID, r.rep.Epoch = stopped.CutoffID, stopped.CutoffID, stopped.Epoch
				r.phase("stop")
				return nil
			}, undo: []undoStep{r.undoResume(srcEP)}},
			r.checkpointPhase(src),
			{name: "still stopped", do: func(ctx context.Context) error { return stillStopped(ctx, srcEP, stopped.CutoffID) }},
			r.imagePhase(src),
		}, nil
	case contract.StrategyCRIUAlone:
		return []phase{r.checkpointPhase(src), r.imagePhase(src)}, nil
	}
	return nil, fmt.Errorf("migration %s: unknown strategy %q (want one of %s)", p.Name, p.Strategy, strings.Join(contract.StrategyNames(), ", "))
}

// stillStopped checks, once the checkpoint is taken, that the source's
// sidecar is still stopped at the cutoff: a sidecar that restarted since
// (it starts serving, knowing nothing of its stop) or that was resumed
// has handed its app deliveries after the cutoff, which the checkpoint
// may hold and the target would never get. The checkpoint is then
// discarded and the migration rolled back.
func stillStopped(ctx context.Context, ep control.Client, cutoff uint64) error {
	st, err := ep.State(ctx)
	if err != nil {
		return fmt.Errorf("read the source's sidecar after the checkpoint: %w", err)
	}
	if st.Mode != control.ModeStopped {
		return fmt.Errorf("the source's sidecar is %s after the checkpoint, not stopped at the cutoff %d: it restarted or was resumed, and may have consumed deliveries after the cutoff, so the checkpoint is discarded (no image is built from it): migrate again", st.Mode, cutoff)
	}
	return nil
}

// checkSourceStopped warns, before the source is deleted, when its
// sidecar serves again after its stop: it restarted (a sidecar keeps
// nothing of a stop across a restart) and the deliveries it took after
// the cutoff are not on the target. Nothing can bring them there any more;
// the report says so, so that the loss is not silent (docs/faults.md,
// known gaps).
func (r *run) checkSourceStopped(ctx context.Context, ep control.Client) {
	if r.p.Strategy == contract.StrategyCRIUAlone {
		return // never stopped
	}
	st, err := ep.State(ctx)
	// A sidecar that restarted is starting until its log is open; it
	// consumes nothing until then, and one with a state folder then
	// comes up stopped at its recorded stop. Wait a little to see which.
	for wait := 0; err == nil && st.Mode == control.ModeStarting && wait < 50; wait++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		st, err = ep.State(ctx)
	}
	if err != nil || st.Mode == control.ModeStopped {
		return // gone or unreadable: it consumes nothing readable either way
	}
	r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("the source's sidecar was %s, not stopped, when the source was deleted: it restarted after its stop at the cutoff %d, and the deliveries it took since are not on the target", st.Mode, r.rep.CutoffID))
}

// copyTakeover is the phase in which a copy strategy's target, once
// running, takes over: ms2m's replay and handover, stop-and-copy's switch;
// a criu-alone target consumes at once.
func (r *run) copyTakeover(srcEP control.Client, running **corev1.Pod, stopped *control.StopResult) phase {
	switch r.p.Strategy {
	case contract.StrategyMS2M, contract.StrategyMS2MCutoff:
		return phase{name: "replay and handover", do: func(ctx context.Context) error {
			tm, err := r.handover(ctx, srcEP, r.endpoint(*running))
			if err != nil {
				r.stopAsked = !errors.Is(err, control.ErrBeforeStop)
				return err
			}
			r.rep.Handover, r.rep.CutoffID, r.rep.Downtime = &tm, tm.CutoffID, tm.Downtime
			r.phase("replay and handover")
			return nil
		}}
	case contract.StrategyStopAndCopy:
		return phase{name: "switch", do: func(ctx context.Context) error {
			switched, err := r.endpoint(*running).WaitSwitched(ctx, r.p.Timeout)
			if err != nil {
				return err
			}
			r.rep.Downtime = switched.Sub(stopped.StartedAt)
			r.phase("switch")
			return nil
		}}
	}
	return phase{name: "no handover", do: func(context.Context) error { return nil }}
}

// checkpointPhase checkpoints src through the kubelet, with the node's
// agent watching for CRIU's dump (only watching: nothing is thawed), for
// Report.Parts.
func (r *run) checkpointPhase(src *corev1.Pod) phase {
	return phase{name: "checkpoint", do: func(ctx context.Context) (err error) {
		seen, stop := r.watchCRIU(ctx, src)
		defer stop()
		if r.rep.Archive, err = r.checkpoint(ctx, src); err != nil {
			return err
		}
		r.phase("checkpoint")
		r.criuDump, r.noDump = seen()
		return nil
	}}
}

// imagePhase builds and pushes the checkpoint image of src's archive; its
// undo deletes it.
func (r *run) imagePhase(src *corev1.Pod) phase {
	return phase{name: "image", do: func(ctx context.Context) (err error) {
		if r.rep.Image, r.rep.Images, err = r.images(ctx, src, r.rep.Archive, r.p.Name); err != nil {
			return err
		}
		r.phase("image")
		return nil
	}, undo: []undoStep{r.undoImages()}}
}

// createTarget creates the target pod, restored from restore, held by the
// source's owner's reference (owner.go).
func (r *run) createTarget(ctx context.Context, src *corev1.Pod, restore Restore) error {
	target, err := r.targetPod(src, r.p.TargetPod, restore)
	if err != nil {
		return err
	}
	if controllerOf(src) != nil {
		holdBy(target, src) // see owner.go
	}
	if _, err := r.env.Client.CoreV1().Pods(r.p.Namespace).Create(ctx, target, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the target pod %s: %w", r.p.TargetPod, err)
	}
	return nil
}

// undoResume resumes the source's sidecar at ep.
func (r *run) undoResume(ep control.Client) undoStep {
	return undoStep{name: "resume the source", done: "the source was resumed and keeps serving", fn: func(ctx context.Context) error {
		if err := ep.Resume(ctx); err != nil {
			return fmt.Errorf("the source could not be resumed: %w", err)
		}
		return nil
	}}
}

// undoImages deletes the checkpoint images this run pushed (its own, and
// its shadow's).
func (r *run) undoImages() undoStep {
	return undoStep{name: "delete the checkpoint images", fn: func(ctx context.Context) error {
		var tags []string
		if r.rep.Image != "" {
			tags = append(tags, r.imageTags(r.p.Name)...)
		}
		if r.rep.ShadowImage != "" {
			tags = append(tags, r.imageTags(ShadowName(r.p.Name))...)
		}
		return r.dropImages(ctx, tags)
	}}
}

// undoTarget deletes the target pod named name, unless the source was
// asked to stop and the target took over or cannot be read (afterStop):
// then nothing older is undone either.
func (r *run) undoTarget(name string) undoStep {
	return undoStep{name: "delete the target",
		guard: func(ctx context.Context, cause error) (bool, error) {
			if !r.stopAsked {
				return false, nil
			}
			return r.afterStop(ctx, cause, name)
		},
		fn: func(ctx context.Context) error { return r.deletePod(ctx, name, "the failed target") },
	}
}

// deletePod deletes the pod named name (what says which); one that is
// gone is no error.
func (r *run) deletePod(ctx context.Context, name, what string) error {
	if err := r.env.Client.CoreV1().Pods(r.p.Namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s: %w", what, name, err)
	}
	return nil
}

// served marks pod, which took over, as serving (Served); a failure is a
// warning: the migration is done.
func (r *run) served(ctx context.Context, pod string) {
	if err := Served(ctx, r.env.Client, r.p.Namespace, pod); err != nil {
		r.rep.Warnings = append(r.rep.Warnings, err.Error())
	}
}

// dropImages deletes the checkpoint images tagged with tags, through the
// agent on the source's node. An agent that cannot delete images deletes
// none; an image that was never pushed is no error (the agent's).
func (r *run) dropImages(ctx context.Context, tags []string) error {
	del, ok := r.env.Agent.(ImageDeleter)
	if !ok || r.source == nil || r.env.ImageRepo == "" {
		return nil
	}
	var errs []error
	for _, tag := range tags {
		ref := CheckpointRef(r.env.ImageRepo, r.p.Namespace, tag, r.env.SigningKey) // the tag, and the manifest it names
		if err := del.DeleteCheckpointImage(ctx, r.source.Spec.NodeName, ref); err != nil {
			errs = append(errs, fmt.Errorf("delete the checkpoint image %s: %w", ref, err))
		}
	}
	return errors.Join(errs...)
}

// dropServedImages deletes the checkpoint images of a migration that
// ended well: the restored pod runs, and an image is the process's whole
// memory, to be kept no longer than needed. What cannot be deleted is a
// warning. Env.KeepImages keeps them.
func (r *run) dropServedImages(ctx context.Context) {
	if r.env.KeepImages {
		return
	}
	var tags []string
	if r.rep.Image != "" || r.pushedBefore {
		tags = append(tags, r.imageTags(r.p.Name)...)
	}
	if r.rep.ShadowImage != "" || r.pushedBefore {
		tags = append(tags, r.imageTags(ShadowName(r.p.Name))...)
	}
	if err := r.dropImages(ctx, tags); err != nil {
		r.rep.Warnings = append(r.rep.Warnings, err.Error())
	}
}

// resume resumes the sidecar at ep after err, and says so in the error.
// ctx is a cleanup's (cleanupContext).
func (r *run) resume(ctx context.Context, err error, ep control.Client) error {
	s := r.undoResume(ep)
	if rerr := s.fn(ctx); rerr != nil {
		return errors.Join(err, rerr)
	}
	return fmt.Errorf("%w (%s)", err, s.done)
}

// checkpoint checkpoints pod's app container through the kubelet, and
// then each of its other app containers (r.others, whose archives go to
// r.archives): the caller holds the sidecar's deliveries for all of them.
// It returns the app container's archive.
func (r *run) checkpoint(ctx context.Context, pod *corev1.Pod) (string, error) {
	archive, err := r.checkpointOne(ctx, pod, r.p.Container)
	if err != nil {
		return "", err
	}
	r.archives = map[string]string{}
	for _, c := range r.others {
		a, err := r.checkpointOne(ctx, pod, c)
		if err != nil {
			return "", err
		}
		r.archives[c] = a
	}
	return archive, nil
}

// checkpointOne checkpoints pod's container through the kubelet: asked by
// the node's agent, or through the API server's node proxy.
func (r *run) checkpointOne(ctx context.Context, pod *corev1.Pod, container string) (string, error) {
	var archive string
	var err error
	if c, ok := r.env.Agent.(Checkpointer); ok && !r.env.CheckpointThroughAPIServer {
		archive, err = c.Checkpoint(ctx, pod.Spec.NodeName, pod.Namespace, pod.Name, container, r.env.Timeouts.Checkpoint)
		if err != nil {
			err = fmt.Errorf("checkpoint %s/%s container %s on node %s, by its agent: %w", pod.Namespace, pod.Name, container, pod.Spec.NodeName, err)
		}
	} else {
		archive, err = Checkpoint(ctx, r.env.Client.CoreV1().RESTClient(), pod.Spec.NodeName, pod.Namespace, pod.Name, container, r.env.Timeouts.Checkpoint)
	}
	if err != nil {
		return "", fmt.Errorf("%w%s", err, r.criuErrors(ctx, pod.Spec.NodeName, err))
	}
	return archive, nil
}

// images builds and pushes the checkpoint image of archive (the app
// container's), tagged tag, and those of the other app containers'
// archives (r.archives), each tagged ContainerTag(tag, container), on
// pod's node. If one fails, those pushed before it are deleted.
func (r *run) images(ctx context.Context, pod *corev1.Pod, archive, tag string) (string, map[string]string, error) {
	img, err := r.image(ctx, pod, archive, r.p.Container, tag)
	if err != nil || len(r.others) == 0 {
		return img, nil, err
	}
	others := map[string]string{}
	for _, c := range r.others {
		if others[c], err = r.image(ctx, pod, r.archives[c], c, ContainerTag(tag, c)); err != nil {
			cctx, cancel := r.cleanupContext(ctx)
			defer cancel()
			tags := []string{tag}
			for pushed := range others {
				if pushed != c {
					tags = append(tags, ContainerTag(tag, pushed))
				}
			}
			return "", nil, errors.Join(fmt.Errorf("app container %s: %w", c, err), r.dropImages(cctx, tags))
		}
	}
	return img, others, nil
}

// image builds and pushes the checkpoint image of archive, container's,
// on pod's node.
func (r *run) image(ctx context.Context, pod *corev1.Pod, archive, container, tag string) (string, error) {
	ref := CheckpointRef(r.env.ImageRepo, pod.Namespace, tag, r.env.SigningKey)
	img, err := r.env.Agent.BuildCheckpointImage(ctx, pod.Spec.NodeName, archive, container, ref)
	if err != nil {
		return "", fmt.Errorf("build and push the checkpoint image %s from %s: %w", ref, filepath.Base(archive), err)
	}
	return img, nil
}

// imageTags are the tags of the checkpoint images of a checkpoint tagged
// tag: the app container's, and each other app container's.
func (r *run) imageTags(tag string) []string {
	tags := []string{tag}
	for _, c := range r.others {
		tags = append(tags, ContainerTag(tag, c))
	}
	return tags
}

// handover stops the source and lets the target replay to the cutoff and
// switch; for ms2m-cutoff, the stop comes once T_cutoff has passed.
func (r *run) handover(ctx context.Context, srcEP, dstEP control.Client) (control.Timings, error) {
	ho := control.HandoverOptions{MaxLag: r.p.MaxLag, SwitchTimeout: r.p.Timeout, ReadRetry: r.env.ReadRetry}
	if r.p.Strategy == contract.StrategyMS2MCutoff {
		lambda, mu, err := srcEP.Rates(ctx)
		if err != nil {
			return control.Timings{}, err
		}
		if _, tmu, err := dstEP.Rates(ctx); err == nil && tmu > 0 {
			mu = tmu // the target's own rate, once it has one
		}
		r.rep.Lambda, r.rep.Mu = lambda, mu
		r.rep.TCutoff = CutoffAfter(r.p.ReplayMax, lambda, mu, r.p.Timeout)
		ho.Deadline = r.now().Add(r.rep.TCutoff)
		r.rep.Cutoff = contract.CutoffFormula
		if r.p.Cutoff == contract.CutoffAdaptive {
			r.rep.Cutoff = contract.CutoffAdaptive
			ho.StopAt = r.adaptiveStop(ctx, dstEP, mu)
		}
	}
	return control.Handover(ctx, srcEP, dstEP, ho)
}

// deleteNow deletes pod at once; one already gone is no error.
func deleteNow(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) error {
	grace := int64(0)
	err := cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or already a new pod of the same name
	}
	return err
}

// Adaptive reports whether a backlog of lag deliveries replays within
// replayMax at mu deliveries per second. Without a measured mu it never
// stops early.
func Adaptive(lag uint64, mu float64, replayMax time.Duration) bool {
	if replayMax <= 0 {
		replayMax = DefaultReplayMax
	}
	return mu > 0 && float64(lag) <= mu*replayMax.Seconds()
}

// adaptiveStop is the adaptive rule for a handover to dst: μ is the
// target's, read again every quarter second while it replays.
// ratesEvery is how often the adaptive rule reads the target's rate again.
const ratesEvery = 250 * time.Millisecond

// DefaultReplayMax is T_replay_max when Plan.ReplayMax is not set.
const DefaultReplayMax = 5 * time.Second

func (r *run) adaptiveStop(ctx context.Context, dst control.Client, mu float64) func(uint64) bool {
	var read time.Time
	return func(lag uint64) bool {
		if now := r.now(); now.Sub(read) > ratesEvery {
			read = now
			if _, m, err := dst.Rates(ctx); err == nil && m > 0 {
				mu = m
				r.rep.Mu = m
			}
		}
		return Adaptive(lag, mu, r.p.ReplayMax)
	}
}

// CutoffAfter is T_cutoff = T_replay_max × μ / λ (the paper's eq. 5): how
// long the source may keep serving once the target replays, so that what
// is left to replay after the stop takes about T_replay_max. Without a
// measured λ or μ it is T_replay_max; it never exceeds limit.
func CutoffAfter(replayMax time.Duration, lambda, mu float64, limit time.Duration) time.Duration {
	if replayMax <= 0 {
		replayMax = DefaultReplayMax
	}
	t := replayMax
	if lambda > 0 && mu > 0 {
		t = time.Duration(float64(replayMax) * mu / lambda)
	}
	if limit > 0 && t > limit {
		t = limit
	}
	return t
}

// targetPod makes the pod to create, admitted as the webhook would when
// Env.Admit is set.
func (r *run) targetPod(src *corev1.Pod, name string, restore Restore) (*corev1.Pod, error) {
	t := TargetPod(src, name, restore, r.env.SigningKey, r.now().Add(r.env.RestoreValidity))
	if r.env.Admit != nil {
		admitted, err := r.env.Admit(t)
		if err != nil {
			return nil, fmt.Errorf("admit the target pod: %w", err)
		}
		t = admitted
	}
	if r.p.Strategy == contract.StrategyCRIUAlone {
		// No replay: the target's sidecar serves at once, on a log of its
		// own so that it does not write into the source's.
		for i := range t.Spec.InitContainers {
			c := &t.Spec.InitContainers[i]
			if c.Name != inject.SidecarName {
				continue
			}
			var env []corev1.EnvVar
			for _, e := range c.Env {
				switch e.Name {
				case "MS2M_REPLAY_START", "MS2M_REPLAY_CUTOFF":
				case "MS2M_LOG_NAME":
					env = append(env, corev1.EnvVar{Name: e.Name, Value: inject.OwnLogName(inject.LogName(src), r.p.Name)})
				default:
					env = append(env, e)
				}
			}
			c.Env = env
		}
	}
	return t, nil
}

// criuErrors quotes the error lines of the CRIU log a checkpoint error
// names, when the agent can read it.
func (r *run) criuErrors(ctx context.Context, node string, err error) string {
	lr, ok := r.env.Agent.(LogReader)
	if !ok {
		return ""
	}
	path := criuLogPath(err.Error())
	if path == "" {
		return ""
	}
	log, rerr := lr.ReadLog(ctx, node, path)
	if rerr != nil {
		return ""
	}
	if lines := criuErrorLines(log); lines != "" {
		return "; CRIU says:\n" + lines
	}
	return ""
}

// criuLogPath finds the CRIU log in runc's error ("... path= /x/criu-dump.log)").
func criuLogPath(msg string) string {
	_, after, ok := strings.Cut(msg, "path= ")
	if !ok {
		return ""
	}
	end := strings.IndexAny(after, ") \"\n")
	if end < 0 {
		end = len(after)
	}
	if p := after[:end]; strings.HasSuffix(p, ".log") {
		return p
	}
	return ""
}

// criuErrorLines keeps a CRIU log's "Error" lines, at most ten.
func criuErrorLines(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "Error (") && len(out) < 10 {
			out = append(out, "  "+strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "\n")
}

// containerID is the runtime's ID of a container of pod, without its
// scheme (containerd://).
func containerID(pod *corev1.Pod, container string) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == container {
			if _, id, ok := strings.Cut(cs.ContainerID, "://"); ok {
				return id
			}
			return cs.ContainerID
		}
	}
	return ""
}

// imageID is the image a container of pod runs, as name@digest.
func imageID(pod *corev1.Pod, container string) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == container {
			return strings.TrimPrefix(cs.ImageID, "docker-pullable://")
		}
	}
	return ""
}

// sidecarServes checks that the source's sidecar is healthy and serves: a
// sidecar that is quiesced or stopped belongs to a migration under way, and
// one that replays is a migration's target that has not taken over.
func (r *run) sidecarServes(ctx context.Context, src *corev1.Pod) error {
	ep := r.endpoint(src)
	st, err := ep.Inspect(ctx)
	if err != nil {
		return fmt.Errorf("pod %s/%s: its sidecar does not answer (%w): check the pod's %s container and its log", src.Namespace, src.Name, err, inject.SidecarName)
	}
	switch {
	case st.Mode == "quiesced" || st.Mode == "stopped":
		return fmt.Errorf("pod %s/%s is already migrating: its sidecar is %s, as a migration under way leaves it; wait for that migration to end (migrator status %s/%s), or, if its migrator is gone for good, resume the sidecar (POST /resume on its control port)", src.Namespace, src.Name, st.Mode, src.Namespace, src.Name)
	case st.Replaying:
		return fmt.Errorf("pod %s/%s is already migrating: it is a migration's target and still replays; wait until it has taken over", src.Namespace, src.Name)
	case !st.Ready:
		return fmt.Errorf("pod %s/%s: its sidecar is not ready (its replay log is not open yet): wait, or read the %s container's log", src.Namespace, src.Name, inject.SidecarName)
	case len(st.Unreplayable) > 0:
		var qs []string
		for _, q := range st.Unreplayable {
			qs = append(qs, fmt.Sprintf("queue %q is %s", q.Queue, q.Reason))
		}
		return fmt.Errorf("pod %s/%s consumes a queue that a migration cannot carry over, so nothing was checkpointed: %s; have the app consume a named, durable queue that is neither exclusive nor auto-delete",
			src.Namespace, src.Name, strings.Join(qs, "; "))
	}
	return nil
}

// natsStrategy is an error if src's app speaks NATS and strategy is
// criu-alone: with no replay it is never exact (what the source handles
// after its checkpoint is not on the target), and it is offered for AMQP
// only as the benchmarks' baseline (docs/nats.md). Every other strategy
// migrates NATS consumers exactly.
func natsStrategy(src *corev1.Pod, strategy contract.Strategy) error {
	if !inject.SpeaksNATS(src) || strategy != contract.StrategyCRIUAlone {
		return nil
	}
	return fmt.Errorf("pod %s/%s's app speaks NATS, and strategy %s is not offered for NATS consumers: with no replay it loses what the source handles after its checkpoint (see docs/nats.md); set annotation %s to %s, or leave it to %s",
		src.Namespace, src.Name, strategy, contract.AnnotationStrategy, contract.StrategyMS2M, contract.StrategyAuto)
}

// otherApps are src's app containers other than container (the one
// Plan.Container names), in the pod's order: a pod's app containers are
// checkpointed and restored together (a whole pod), unless
// contract.AnnotationContainer names one, which says the others keep no
// state.
func otherApps(src *corev1.Pod, container string) []string {
	if container == "" {
		container = inject.AppContainer(src)
	}
	var out []string
	for _, c := range inject.AppContainers(src) {
		if c != container {
			out = append(out, c)
		}
	}
	return out
}

// preconditions checks what a migration needs before it touches anything.
func preconditions(ctx context.Context, cs kubernetes.Interface, src *corev1.Pod, p Plan) error {
	if !p.Strategy.Valid() {
		return fmt.Errorf("unknown strategy %q (want one of %s)", p.Strategy, strings.Join(contract.StrategyNames(), ", "))
	}
	if _, ok := src.Annotations[contract.AnnotationStatus]; !ok {
		return fmt.Errorf("pod %s/%s has no ms2m sidecar (annotation %s missing): opt it in with %s: \"true\" and recreate it", src.Namespace, src.Name, contract.AnnotationStatus, contract.AnnotationInject)
	}
	if !podReady(src) {
		return fmt.Errorf("pod %s/%s is not running and ready: %s", src.Namespace, src.Name, describe(src))
	}
	if src.Spec.NodeName == p.TargetNode {
		return fmt.Errorf("pod %s/%s already runs on node %s: pick another target", src.Namespace, src.Name, p.TargetNode)
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, p.TargetNode, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("target node %s: %w", p.TargetNode, err)
	}
	ready := false
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			ready = true
		}
	}
	if !ready || node.Spec.Unschedulable {
		return fmt.Errorf("target node %s is not Ready and schedulable", p.TargetNode)
	}
	if !Forced(src) {
		if err := CheckPlacement(src, node); err != nil {
			return err
		}
	}
	switch sts := ownedByStatefulSet(src); {
	case sts && p.Strategy != contract.StrategyStatefulSet && p.Strategy != contract.StrategyStatefulSetShadow:
		return fmt.Errorf("pod %s/%s belongs to StatefulSet %s, which would recreate it with empty state beside a copy: use strategy %s or %s (or %s)", src.Namespace, src.Name, controllerOf(src).Name, contract.StrategyStatefulSetShadow, contract.StrategyStatefulSet, contract.StrategyAuto)
	case !sts && (p.Strategy == contract.StrategyStatefulSet || p.Strategy == contract.StrategyStatefulSetShadow):
		return fmt.Errorf("pod %s/%s is not a StatefulSet's pod: strategy %s needs one; use %s (or %s)", src.Namespace, src.Name, p.Strategy, contract.StrategyMS2M, contract.StrategyAuto)
	}
	if err := natsStrategy(src, p.Strategy); err != nil {
		return err
	}
	found := false
	for _, c := range src.Spec.Containers {
		found = found || c.Name == p.Container
	}
	if !found {
		return fmt.Errorf("pod %s/%s has no container %q", src.Namespace, src.Name, p.Container)
	}
	return nil
}
