package migrate

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/inject"
)

// Strategy names a way to migrate.
type Strategy string

const (
	// StopAndCopy stops the source at a cutoff, checkpoints it, and
	// restores the target; nothing consumes in between.
	StopAndCopy Strategy = "stop-and-copy"
	// MS2M checkpoints the source while it keeps serving, restores the
	// target, lets it replay the log, and hands over at a cutoff.
	MS2M Strategy = "ms2m"
	// MS2MCutoff is MS2M with the source stopped once T_cutoff has passed
	// since the target began to replay, T_cutoff = T_replay_max × μ / λ
	// (the paper's eq. 5, λ and μ measured live by the sidecars), so that
	// the replay after the stop stays bounded as λ approaches μ.
	MS2MCutoff Strategy = "ms2m-cutoff"
	// CRIUAlone checkpoints and restores with no quiesce and no replay: the
	// baseline that shows what replay is for. It loses what the source
	// handled after its checkpoint.
	CRIUAlone Strategy = "criu-alone"
	// StatefulSet is the paper's strategy for a StatefulSet pod, whose
	// name is its identity: checkpoint it while it serves, stop it at a
	// cutoff once the image is pushed, and delete it; the StatefulSet
	// controller recreates the pod, the webhook turns it into a restore on
	// the target node (from a pending-migration record), and it replays
	// to the cutoff. Down from the stop until the new pod consumes.
	StatefulSet Strategy = "statefulset"
	// StatefulSetShadow gives a StatefulSet pod ms2m's downtime: a shadow
	// pod on the target node takes over from the source by the ms2m
	// handoff; then the source is deleted, the StatefulSet's recreated
	// pod is restored from a checkpoint of the shadow on the same node,
	// and takes over from the shadow by the same handoff.
	StatefulSetShadow Strategy = "statefulset-shadow"
	// Auto picks by owner: statefulset-shadow for a StatefulSet's pod,
	// ms2m for any other.
	Auto Strategy = "auto"
)

// Strategies lists the strategies Run takes, auto first.
var Strategies = []Strategy{Auto, MS2M, MS2MCutoff, StopAndCopy, StatefulSet, StatefulSetShadow, CRIUAlone}

func strategyNames() []string {
	out := make([]string, len(Strategies))
	for i, s := range Strategies {
		out[i] = string(s)
	}
	return out
}

// ByOwner is the strategy auto picks for pod.
func ByOwner(pod *corev1.Pod) Strategy {
	if ownedByStatefulSet(pod) {
		return StatefulSetShadow
	}
	return MS2M
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
	// default resolver), so it is pulled ahead, the way pods pull theirs.
	PullImage(ctx context.Context, node, ref string) error
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
	// ControlToken is the sidecars' control token; ControlPort their
	// control port (default 8089).
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
}

// Plan is one migration.
type Plan struct {
	Name       string // the migration's name; the checkpoint image's tag
	Namespace  string
	Pod        string // the source pod
	Container  string // the app container
	TargetNode string
	TargetPod  string // the new pod's name
	Strategy   Strategy
	// MaxLag is how far behind the target may be when the source is
	// stopped (ms2m). Default 0: the target has replayed everything.
	MaxLag uint64
	// ReplayMax is T_replay_max for MS2MCutoff. Default 5 s.
	ReplayMax time.Duration
	// Cutoff is MS2MCutoff's stop rule. Default CutoffFormula.
	Cutoff CutoffRule
	// Timeout bounds each wait. Default 3 minutes.
	Timeout time.Duration
	// HoldWholeCall keeps a live checkpoint's hold on the source's
	// deliveries for the kubelet's whole checkpoint call. Default (false):
	// the hold ends as soon as the node's agent sees the app frozen
	// (FreezeWatcher; see ARCHITECTURE.md, "Hold until frozen"), and only
	// without a watch, or if it sees no freeze, at the call's end.
	HoldWholeCall bool
}

// Report is what a migration measured.
type Report struct {
	Strategy  Strategy         `json:"strategy"`
	Total     time.Duration    `json:"total"`
	Downtime  time.Duration    `json:"downtime"`
	CutoffID  uint64           `json:"cutoffId,omitempty"`
	Start     uint64           `json:"checkpointId"`
	Epoch     uint64           `json:"epoch,omitempty"` // the log's epoch at the checkpoint
	Phases    []Phase          `json:"phases"`
	Archive   string           `json:"archive"`
	Image     string           `json:"image"`
	TargetPod string           `json:"targetPod"`
	Handover  *control.Timings `json:"handover,omitempty"`
	// Cutoff strategy: the rates it was sized with, and T_cutoff.
	Cutoff  CutoffRule    `json:"cutoff,omitempty"`
	Lambda  float64       `json:"lambda,omitempty"`
	Mu      float64       `json:"mu,omitempty"`
	TCutoff time.Duration `json:"tCutoff,omitempty"`
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
	// Note says what the migrator had to find out on its own: a handover
	// that failed after the target had taken over, which it completed.
	Note string `json:"note,omitempty"`
	// Warnings are what went wrong after the target took over without
	// failing the migration (its restore annotations left, say).
	Warnings []string `json:"warnings,omitempty"`
}

// Refused is the error of a migration that Run refused before it touched
// anything: bad input, or a source that cannot be migrated now.
type Refused struct{ Err error }

func (e *Refused) Error() string { return e.Err.Error() }
func (e *Refused) Unwrap() error { return e.Err }

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
	err := r.do(ctx)
	if err == nil {
		r.dropServedImages()
	}
	r.rep.Total = time.Since(r.began)
	return r.rep, err
}

// newRun fills in env's and p's defaults.
func newRun(env Env, p Plan) *run {
	if env.HTTP == nil {
		env.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	if env.ControlPort == 0 {
		env.ControlPort = 8089
	}
	if env.ReadRetry <= 0 {
		env.ReadRetry = control.DefaultReadRetry
	}
	if env.RestoreValidity <= 0 {
		env.RestoreValidity = inject.DefaultRestoreValidity
	}
	if p.Timeout == 0 {
		p.Timeout = 3 * time.Minute
	}
	return &run{env: env, p: p, rep: Report{Strategy: p.Strategy, TargetPod: p.TargetPod}, began: time.Now()}
}

type run struct {
	env    Env
	p      Plan
	rep    Report
	began  time.Time
	last   time.Time
	source *corev1.Pod
	// pushedBefore: images of this migration may have been pushed by a
	// migrator that stopped, so deleteImages tries them all.
	pushedBefore bool
}

func (r *run) phase(name string) {
	now := time.Now()
	if r.last.IsZero() {
		r.last = r.began
	}
	took := now.Sub(r.last)
	r.last = now
	r.rep.Phases = append(r.rep.Phases, Phase{Name: name, Took: took})
	if r.env.Progress != nil {
		r.env.Progress(name, took)
	}
}

func (r *run) endpoint(pod *corev1.Pod) control.Client {
	return control.ClientAt(pod.Status.PodIP, r.env.ControlPort, r.env.ControlToken, r.env.HTTP)
}

func (r *run) do(ctx context.Context) error {
	p, cs := r.p, r.env.Client
	src, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Pod, metav1.GetOptions{})
	if err != nil {
		return &Refused{fmt.Errorf("migration %s: the source pod: %w", p.Name, err)}
	}
	if r.p.Strategy == Auto || r.p.Strategy == "" {
		r.p.Strategy = ByOwner(src)
		r.rep.Strategy = r.p.Strategy
	}
	if err := preconditions(ctx, cs, src, r.p); err != nil {
		return &Refused{fmt.Errorf("migration %s: %w", p.Name, err)}
	}
	if err := r.sidecarServes(ctx, src); err != nil {
		return &Refused{fmt.Errorf("migration %s: %w", p.Name, err)}
	}
	r.source = src
	r.phase("preconditions")

	base := imageID(src, p.Container)
	if base == "" {
		return fmt.Errorf("migration %s: pod %s/%s reports no image ID for container %s", p.Name, p.Namespace, p.Pod, p.Container)
	}
	if err := r.env.Agent.PullImage(ctx, p.TargetNode, base); err != nil {
		return fmt.Errorf("migration %s: pull the app's image %s on the target node %s: %w", p.Name, base, p.TargetNode, err)
	}
	r.phase("prepare target")

	switch r.p.Strategy {
	case StatefulSet:
		return r.statefulSet(ctx)
	case StatefulSetShadow:
		return r.statefulSetShadow(ctx)
	}
	return r.podCopy(ctx)
}

// podCopy migrates by a copy of the source under a new name (ms2m,
// ms2m-cutoff, stop-and-copy, criu-alone).
func (r *run) podCopy(ctx context.Context) (err error) {
	p, cs, src := r.p, r.env.Client, r.source
	srcEP := r.endpoint(src)

	// On a failure before the target has taken over, the source serves
	// again and a half-made target goes. Once the source was asked to
	// stop, the target may have taken over even if the migration failed
	// (a read of it failed, the migrator's context ended): that is found
	// out first (afterStop), and a target that took over, or that cannot
	// be read, is never deleted.
	resumeSource := false
	targetCreated := false
	stopAsked := false
	tookOver := false
	defer func() {
		if err == nil || tookOver {
			return
		}
		if targetCreated && stopAsked {
			if handled, out := r.afterStop(ctx, err, p.TargetPod); handled {
				err = out
				return
			}
		}
		err = r.dropImages(err)
		if targetCreated {
			if derr := cs.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.TargetPod, metav1.DeleteOptions{}); derr != nil {
				err = errors.Join(err, fmt.Errorf("delete the failed target %s: %w", p.TargetPod, derr))
			}
		}
		if resumeSource {
			err = r.resume(err, srcEP)
		}
	}()

	var stopped control.StopResult
	switch p.Strategy {
	case MS2M, MS2MCutoff:
		cut, err := r.liveCheckpoint(ctx, src, p.Name, "")
		if err != nil {
			return fmt.Errorf("migration %s: %w", p.Name, err)
		}
		resumeSource = true
		r.rep.Start, r.rep.Epoch = cut.ID, cut.Epoch
	case StopAndCopy, CRIUAlone:
		if p.Strategy == StopAndCopy {
			if stopped, err = srcEP.Stop(ctx, 60*time.Second); err != nil {
				return fmt.Errorf("migration %s: %w", p.Name, err)
			}
			resumeSource, stopAsked = true, true
			r.rep.Start, r.rep.CutoffID, r.rep.Epoch = stopped.CutoffID, stopped.CutoffID, stopped.Epoch
			r.phase("stop")
		}
		if r.rep.Archive, err = r.checkpoint(ctx, src); err != nil {
			return fmt.Errorf("migration %s: %w", p.Name, err)
		}
		r.phase("checkpoint")
		if r.rep.Image, err = r.image(ctx, src, r.rep.Archive, p.Name); err != nil {
			return fmt.Errorf("migration %s: %w", p.Name, err)
		}
		r.phase("image")
	default:
		return fmt.Errorf("migration %s: unknown strategy %q (want one of %s)", p.Name, p.Strategy, strings.Join(strategyNames(), ", "))
	}

	restore := Restore{Migration: p.Name, Image: r.rep.Image, Node: p.TargetNode, LogName: inject.LogName(src), Start: r.rep.Start, Epoch: r.rep.Epoch}
	if p.Strategy == StopAndCopy {
		restore.Cutoff = r.rep.CutoffID
	}
	target, err := r.targetPod(src, p.TargetPod, restore)
	if err != nil {
		return fmt.Errorf("migration %s: %w", p.Name, err)
	}
	if controllerOf(src) != nil {
		holdBy(target, src) // see owner.go
	}
	if _, err := cs.CoreV1().Pods(p.Namespace).Create(ctx, target, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("migration %s: create the target pod %s: %w", p.Name, p.TargetPod, err)
	}
	targetCreated = true
	running, err := WaitRunning(ctx, cs, p.Namespace, p.TargetPod, p.Timeout)
	if err != nil {
		return fmt.Errorf("migration %s: the restore failed: %w", p.Name, err)
	}
	r.phase("restore")
	dstEP := r.endpoint(running)

	switch p.Strategy {
	case MS2M, MS2MCutoff:
		tm, err := r.handover(ctx, srcEP, dstEP)
		if err != nil {
			stopAsked = !errors.Is(err, control.ErrBeforeStop)
			return fmt.Errorf("migration %s: %w", p.Name, err)
		}
		r.rep.Handover, r.rep.CutoffID, r.rep.Downtime = &tm, tm.CutoffID, tm.Downtime
		r.phase("replay and handover")
	case StopAndCopy:
		switched, err := dstEP.WaitSwitched(ctx, p.Timeout)
		if err != nil {
			return fmt.Errorf("migration %s: %w", p.Name, err)
		}
		r.rep.Downtime = switched.Sub(stopped.StartedAt)
		r.phase("switch")
	}
	resumeSource, targetCreated, tookOver = false, false, true

	if err := handBack(ctx, cs, src, p.TargetPod, p.Timeout); err != nil {
		return fmt.Errorf("migration %s: the target serves, but: %w", p.Name, err)
	}
	r.served(ctx, p.TargetPod)
	if err := deleteNow(ctx, cs, src); err != nil {
		return fmt.Errorf("migration %s: the target serves, but deleting the source %s failed: %w", p.Name, p.Pod, err)
	}
	r.phase("finalise")
	return nil
}

// served marks pod, which took over, as serving (Served); a failure is a
// warning: the migration is done.
func (r *run) served(ctx context.Context, pod string) {
	if err := Served(ctx, r.env.Client, r.p.Namespace, pod); err != nil {
		r.rep.Warnings = append(r.rep.Warnings, err.Error())
	}
}

// dropImages deletes the checkpoint images this run pushed, after err,
// when the target that needed them never took over. An agent that cannot
// delete adds to the error.
func (r *run) dropImages(err error) error {
	return errors.Join(err, r.deleteImages())
}

// dropServedImages deletes the checkpoint images of a migration that
// ended well: the restored pod runs, and an image is the process's whole
// memory, to be kept no longer than needed. What cannot be deleted is a
// warning. Env.KeepImages keeps them.
func (r *run) dropServedImages() {
	if r.env.KeepImages {
		return
	}
	if err := r.deleteImages(); err != nil {
		r.rep.Warnings = append(r.rep.Warnings, err.Error())
	}
}

// deleteImages deletes the checkpoint images this run pushed, through the
// source node's agent.
func (r *run) deleteImages() error {
	del, ok := r.env.Agent.(ImageDeleter)
	if !ok || r.source == nil {
		return nil
	}
	var errs []error
	for _, img := range []struct{ pushed, tag string }{{r.rep.Image, r.p.Name}, {r.rep.ShadowImage, ShadowName(r.p.Name)}} {
		if img.pushed == "" && !r.pushedBefore {
			continue
		}
		ref := CheckpointRef(r.env.ImageRepo, r.p.Namespace, img.tag, r.env.SigningKey) // the tag, and the manifest it names
		if derr := del.DeleteCheckpointImage(context.Background(), r.source.Spec.NodeName, ref); derr != nil {
			errs = append(errs, fmt.Errorf("delete the checkpoint image %s: %w", ref, derr))
		}
	}
	return errors.Join(errs...)
}

// resume resumes the sidecar at ep after err, and says so in the error.
func (r *run) resume(err error, ep control.Client) error {
	if rerr := ep.Resume(context.Background()); rerr != nil {
		return errors.Join(err, fmt.Errorf("the source could not be resumed: %w", rerr))
	}
	return fmt.Errorf("%w (the source was resumed and keeps serving)", err)
}

// liveCheckpoint checkpoints pod while it keeps serving: quiesce its
// sidecar, checkpoint the app, resume, and build the checkpoint image
// (tagged tag). Its phases are named with prefix. On an error after the
// quiesce, pod serves again.
func (r *run) liveCheckpoint(ctx context.Context, pod *corev1.Pod, tag, prefix string) (cut control.Cut, err error) {
	ep := r.endpoint(pod)
	steps := holdSteps{
		checkpoint: func(ctx context.Context) (string, error) { return r.checkpoint(ctx, pod) },
		atFreeze:   !r.p.HoldWholeCall,
	}
	// The freeze watch starts before the quiesce, so that setting it up
	// adds nothing to the hold; nothing freezes the app before the
	// checkpoint call.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if fw, ok := r.env.Agent.(FreezeWatcher); ok {
		if id := containerID(pod, r.p.Container); id != "" {
			steps.watch = func(ctx context.Context, state string) (func() error, error) {
				return fw.WatchFreeze(ctx, pod.Spec.NodeName, string(pod.UID), id, state, time.Minute)
			}
			steps.frozen, steps.frozenErr = steps.watch(wctx, "frozen")
		}
	}
	quiesced := time.Now()
	if cut, err = ep.Quiesce(ctx, 30*time.Second); err != nil {
		return cut, err
	}
	r.phase(prefix + "quiesce")
	steps.resume = func(ctx context.Context) error { return ep.ResumeHold(ctx, cut.Hold) }
	held := checkpointUnderHold(ctx, steps, quiesced)
	archive, resumeErr := held.archive, held.resumeErr
	report := func() {
		ht := held.events.timings()
		ht.AtFreeze, ht.Fallback = held.resumed, held.fallback
		if prefix == "" {
			r.rep.Hold = &ht
		} else {
			r.rep.ShadowHold = &ht
		}
	}
	if held.err != nil {
		report()
		if held.resumed && resumeErr == nil {
			return cut, fmt.Errorf("%w (the source was resumed at its freeze and keeps serving)", held.err)
		}
		return cut, r.resume(held.err, ep)
	}
	r.phase(prefix + "checkpoint")
	if !held.resumed {
		resumeErr = ep.ResumeHold(ctx, cut.Hold)
		held.events.Resumed = time.Now()
	}
	report()
	if err := held.events.releaseErr(); err != nil {
		return cut, fmt.Errorf("the hold invariant was broken (%w): the checkpoint %s may hold deliveries after the checkpoint ID, so it is discarded (no image is built from it): migrate again", err, filepath.Base(archive))
	}
	if err := resumeErr; err != nil {
		if errors.Is(err, control.ErrConflict) {
			// The sidecar did not stay quiesced (it restarted, say): the
			// checkpoint may hold deliveries after cut.ID, which a target
			// would get again. No image is built from it; the sidecar is
			// left as it is (a restarted one serves).
			return cut, fmt.Errorf("%w; the checkpoint %s is discarded (no image is built from it) and nothing was deleted: migrate again", err, filepath.Base(archive))
		}
		return cut, err
	}
	r.phase(prefix + "resume")
	image, err := r.image(ctx, pod, archive, tag)
	if err != nil {
		return cut, err
	}
	r.phase(prefix + "image")
	if prefix == "" {
		r.rep.Archive, r.rep.Image = archive, image
	} else {
		r.rep.ShadowImage = image
	}
	return cut, nil
}

// checkpoint checkpoints pod's app container through the kubelet.
func (r *run) checkpoint(ctx context.Context, pod *corev1.Pod) (string, error) {
	archive, err := Checkpoint(ctx, r.env.Client.CoreV1().RESTClient(), pod.Spec.NodeName, pod.Namespace, pod.Name, r.p.Container, time.Minute)
	if err != nil {
		return "", fmt.Errorf("%w%s", err, r.criuErrors(ctx, pod.Spec.NodeName, err))
	}
	return archive, nil
}

// image builds and pushes the checkpoint image of archive, on pod's node.
func (r *run) image(ctx context.Context, pod *corev1.Pod, archive, tag string) (string, error) {
	ref := CheckpointRef(r.env.ImageRepo, pod.Namespace, tag, r.env.SigningKey)
	img, err := r.env.Agent.BuildCheckpointImage(ctx, pod.Spec.NodeName, archive, r.p.Container, ref)
	if err != nil {
		return "", fmt.Errorf("build and push the checkpoint image %s from %s: %w", ref, filepath.Base(archive), err)
	}
	return img, nil
}

// handover stops the source and lets the target replay to the cutoff and
// switch; for ms2m-cutoff, the stop comes once T_cutoff has passed.
func (r *run) handover(ctx context.Context, srcEP, dstEP control.Client) (control.Timings, error) {
	ho := control.HandoverOptions{MaxLag: r.p.MaxLag, SwitchTimeout: r.p.Timeout, ReadRetry: r.env.ReadRetry}
	if r.p.Strategy == MS2MCutoff {
		lambda, mu, err := srcEP.Rates(ctx)
		if err != nil {
			return control.Timings{}, err
		}
		if _, tmu, err := dstEP.Rates(ctx); err == nil && tmu > 0 {
			mu = tmu // the target's own rate, once it has one
		}
		r.rep.Lambda, r.rep.Mu = lambda, mu
		r.rep.TCutoff = CutoffAfter(r.p.ReplayMax, lambda, mu, r.p.Timeout)
		ho.Deadline = time.Now().Add(r.rep.TCutoff)
		r.rep.Cutoff = CutoffFormula
		if r.p.Cutoff == CutoffAdaptive {
			r.rep.Cutoff = CutoffAdaptive
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

// CutoffRule is how ms2m-cutoff decides when to stop the source.
type CutoffRule string

const (
	// CutoffFormula stops the source once T_cutoff (CutoffAfter, the
	// paper's eq. 5, sized by λ and μ when the handover begins) has passed.
	CutoffFormula CutoffRule = "formula"
	// CutoffAdaptive stops it as soon as the target's live backlog can be
	// replayed within T_replay_max at the target's live rate (Adaptive),
	// and at the latest when T_cutoff passes: the bound on the replay after
	// the stop holds however the rates move, and the source stops no later
	// than by the formula.
	CutoffAdaptive CutoffRule = "adaptive"
)

// ParseCutoffRule reads a rule by name; "" is CutoffFormula.
func ParseCutoffRule(s string) (CutoffRule, error) {
	switch r := CutoffRule(s); r {
	case "":
		return CutoffFormula, nil
	case CutoffFormula, CutoffAdaptive:
		return r, nil
	}
	return "", fmt.Errorf("unknown cutoff rule %q (want %s or %s)", s, CutoffFormula, CutoffAdaptive)
}

// Adaptive reports whether a backlog of lag deliveries replays within
// replayMax at mu deliveries per second. Without a measured mu it never
// stops early.
func Adaptive(lag uint64, mu float64, replayMax time.Duration) bool {
	if replayMax <= 0 {
		replayMax = 5 * time.Second
	}
	return mu > 0 && float64(lag) <= mu*replayMax.Seconds()
}

// adaptiveStop is the adaptive rule for a handover to dst: μ is the
// target's, read again every quarter second while it replays.
func (r *run) adaptiveStop(ctx context.Context, dst control.Client, mu float64) func(uint64) bool {
	var read time.Time
	return func(lag uint64) bool {
		if time.Since(read) > 250*time.Millisecond {
			read = time.Now()
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
		replayMax = 5 * time.Second
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
	t := TargetPod(src, name, restore, r.env.SigningKey, time.Now().Add(r.env.RestoreValidity))
	if r.env.Admit != nil {
		admitted, err := r.env.Admit(t)
		if err != nil {
			return nil, fmt.Errorf("admit the target pod: %w", err)
		}
		t = admitted
	}
	if r.p.Strategy == CRIUAlone {
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
	}
	return nil
}

// preconditions checks what a migration needs before it touches anything.
func preconditions(ctx context.Context, cs kubernetes.Interface, src *corev1.Pod, p Plan) error {
	if !slices.Contains(Strategies, p.Strategy) {
		return fmt.Errorf("unknown strategy %q (want one of %s)", p.Strategy, strings.Join(strategyNames(), ", "))
	}
	if _, ok := src.Annotations[inject.AnnotationStatus]; !ok {
		return fmt.Errorf("pod %s/%s has no ms2m sidecar (annotation %s missing): opt it in with %s: \"true\" and recreate it", src.Namespace, src.Name, inject.AnnotationStatus, inject.AnnotationInject)
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
	case sts && p.Strategy != StatefulSet && p.Strategy != StatefulSetShadow:
		return fmt.Errorf("pod %s/%s belongs to StatefulSet %s, which would recreate it with empty state beside a copy: use strategy %s or %s (or %s)", src.Namespace, src.Name, controllerOf(src).Name, StatefulSetShadow, StatefulSet, Auto)
	case !sts && (p.Strategy == StatefulSet || p.Strategy == StatefulSetShadow):
		return fmt.Errorf("pod %s/%s is not a StatefulSet's pod: strategy %s needs one; use %s (or %s)", src.Namespace, src.Name, p.Strategy, MS2M, Auto)
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
