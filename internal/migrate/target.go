package migrate

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/inject"
)

// Restore names what a target pod restores.
type Restore struct {
	Migration string // the migration's name
	Image     string // the checkpoint image of the app container
	// Images are the checkpoint images of the pod's other app containers
	// (a whole pod), by container.
	Images  map[string]string
	Node    string // the target node
	LogName string // the source's replay log
	Start   uint64 // the checkpoint ID
	// Cutoff is the last ID to replay; 0 means the source's cutoff marker.
	Cutoff uint64
	// Epoch is the log's epoch at the checkpoint: only a cutoff marker of
	// a later epoch ends the replay.
	Epoch uint64
	// Skip are delivery IDs in the range not to replay, ascending: what
	// the broker requeued when a restarted app left without acking it
	// (Rebuild).
	Skip []uint64
}

// instruction is r as the webhook reads it, unsigned.
func (r Restore) instruction() inject.Migration {
	skip := make([]string, len(r.Skip))
	for i, id := range r.Skip {
		skip[i] = strconv.FormatUint(id, 10)
	}
	return inject.Migration{
		Name: r.Migration, Image: r.Image, Node: r.Node, LogName: r.LogName,
		ReplayStart: fmt.Sprint(r.Start), ReplayCutoff: r.cutoff(), ReplayEpoch: fmt.Sprint(r.Epoch),
		ReplaySkip: strings.Join(skip, ","), Images: r.Images,
	}
}

// Pending is r as the webhook reads it for the pod namespace/pod that it
// restores without the migrator creating it (the StatefulSet strategies),
// signed with key until expires.
func (r Restore) Pending(namespace, pod string, key []byte, expires time.Time) inject.Migration {
	m := r.instruction()
	m.Signature = inject.SignRestore(key, namespace, pod, m, expires)
	return m
}

// atStop makes r replay up to a stop's cutoff ID and epoch. A stop at ID 0
// (the source logged no delivery at all) has no cutoff ID to give, since
// 0 reads as "learn it from the marker": r then learns it from that stop's
// own marker, the first one of an epoch above the one before it.
func (r Restore) atStop(cutoff, epoch uint64) Restore {
	r.Cutoff, r.Epoch = cutoff, epoch
	if cutoff == 0 && epoch > 0 {
		r.Epoch = epoch - 1
	}
	return r
}

func (r Restore) cutoff() string {
	if r.Cutoff == 0 {
		return "marker"
	}
	return fmt.Sprint(r.Cutoff)
}

// TargetPod returns the pod to create for r: a copy of the injected source
// pod under a new name, with the restore annotations that the webhook (or
// inject.Inject) turns into a restore, signed with key until expires (the
// webhook restores nothing unsigned). Owner references are dropped: the
// copy is the migrator's until it replaces the source.
func TargetPod(source *corev1.Pod, name string, r Restore, key []byte, expires time.Time) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   source.Namespace,
			Labels:      copyMap(source.Labels),
			Annotations: copyMap(source.Annotations),
		},
		Spec: *source.Spec.DeepCopy(),
	}
	p.Spec.NodeName = ""
	// The target is not asked to migrate again, and what the source was
	// restored from is not what the target is.
	for _, k := range []string{contract.AnnotationMigrateTo, contract.AnnotationMigrateForce, contract.AnnotationStrategy, contract.AnnotationReplayMax, contract.AnnotationCutoff, contract.AnnotationMigrationStatus, contract.AnnotationMigrationStatusSignature, contract.AnnotationRestoredFrom, contract.AnnotationEvacuate} {
		delete(p.Annotations, k)
	}
	m := r.instruction()
	delete(p.Annotations, contract.AnnotationReplaySkip)
	if m.ReplaySkip != "" {
		p.Annotations[contract.AnnotationReplaySkip] = m.ReplaySkip
	}
	delete(p.Annotations, contract.AnnotationRestoreImages)
	if len(m.Images) > 0 {
		p.Annotations[contract.AnnotationRestoreImages] = inject.EncodeImages(m.Images)
	}
	for k, v := range map[string]string{
		contract.AnnotationRestoreImage:     m.Image,
		contract.AnnotationRestoreNode:      m.Node,
		contract.AnnotationReplayStart:      m.ReplayStart,
		contract.AnnotationReplayCutoff:     m.ReplayCutoff,
		contract.AnnotationReplayEpoch:      m.ReplayEpoch,
		contract.AnnotationLogName:          m.LogName,
		contract.AnnotationMigrationName:    m.Name,
		contract.AnnotationRestoreSignature: inject.SignRestore(key, p.Namespace, name, m, expires),
	} {
		p.Annotations[k] = v
	}
	return p
}

// Served makes pod ns/name, a restore that has taken over and serves, read
// as an ordinary pod of its workload: the annotations that asked for the
// restore go (inject.RestoreRequestAnnotations), and what it was restored
// from is kept under contract.AnnotationRestoredFrom, for an app that
// restarts from the checkpoint. A pod that is not a restore is left alone.
func Served(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("mark the restored pod %s/%s as serving: %w", ns, name, err)
	}
	from, ok := inject.RestoredFromPod(pod)
	if !ok {
		return nil
	}
	from.AppRestarts = AppRestarts(pod)
	ann := map[string]any{contract.AnnotationRestoredFrom: from.Encode()}
	for _, k := range inject.RestoreRequestAnnotations {
		if _, ok := pod.Annotations[k]; ok {
			ann[k] = nil
		}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("mark the restored pod %s/%s as serving (remove its restore annotations, record %s): %w", ns, name, contract.AnnotationRestoredFrom, err)
	}
	return nil
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// WaitRunning waits until pod ns/name runs with every container ready, and
// returns it. It fails early, with the container's own reason, when a
// container cannot start (a failed restore shows here).
func WaitRunning(ctx context.Context, cs kubernetes.Interface, ns, name string, timeout time.Duration) (*corev1.Pod, error) {
	return waitRunning(ctx, SystemClock, cs, ns, name, timeout)
}

// waitRunning is WaitRunning with its deadline by clk; the context's, the
// same timeout by the system's clock, still bounds a call that hangs.
func waitRunning(ctx context.Context, clk Clock, cs kubernetes.Interface, ns, name string, timeout time.Duration) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline := clk.Now().Add(timeout)
	var last *corev1.Pod
	for {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p
			if problem := podProblem(p); problem != "" {
				return p, fmt.Errorf("pod %s/%s: %s", ns, name, problem)
			}
			if podReady(p) {
				return p, nil
			}
		}
		if clk.Now().After(deadline) {
			return last, fmt.Errorf("pod %s/%s not running and ready after %s: %s", ns, name, timeout, describe(last))
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("pod %s/%s not running and ready after %s: %s", ns, name, timeout, describe(last))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podProblem returns why a pod cannot become ready, if that is certain.
// A CreateContainerConfigError is certain (a missing Secret key, say)
// unless the kubelet only timed out syncing its Secret or ConfigMap cache,
// which it does on a loaded node and retries by itself.
func podProblem(p *corev1.Pod) string {
	if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		return fmt.Sprintf("phase %s: %s", p.Status.Phase, describe(p))
	}
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			if w.Reason == "CreateContainerConfigError" && cacheSyncTimeout.MatchString(w.Message) {
				continue
			}
			switch w.Reason {
			case "CreateContainerError", "CreateContainerConfigError", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff", "RunContainerError":
				msg := fmt.Sprintf("container %s: %s: %s", cs.Name, w.Reason, w.Message)
				if t := cs.LastTerminationState.Terminated; t != nil && t.Message != "" {
					// The runtime's own words: a failed restore's CRIU error.
					msg += fmt.Sprintf("; it last ended with %s (exit %d): %s", t.Reason, t.ExitCode, t.Message)
				}
				return msg
			}
		}
	}
	return ""
}

// cacheSyncTimeout is the kubelet's message for a Secret or ConfigMap
// cache that did not sync in time ("failed to sync secret cache: timed out
// waiting for the condition").
var cacheSyncTimeout = regexp.MustCompile(`^failed to sync (secret|configmap) cache`)

// describe summarises a pod's status for an error message.
func describe(p *corev1.Pod) string {
	if p == nil {
		return "the pod was never seen"
	}
	var parts []string
	parts = append(parts, "phase "+string(p.Status.Phase))
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		switch {
		case cs.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("%s waiting (%s: %s)", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message))
		case cs.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("%s terminated (%s, exit %d: %s)", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode, cs.State.Terminated.Message))
		case cs.State.Running != nil:
			parts = append(parts, fmt.Sprintf("%s running (ready %v)", cs.Name, cs.Ready))
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			parts = append(parts, fmt.Sprintf("%s: %s", c.Type, c.Message))
		}
	}
	return strings.Join(parts, "; ")
}

// SidecarControl returns how the controller reaches the control API of
// pod's sidecar: its port (named ms2m-control) and its namespace's token,
// derived from the controller's key (control.TokenFor). No Secret is read:
// the controller trusts no token a tenant could have written, and needs no
// right on Secrets in the tenants' namespaces.
func SidecarControl(pod *corev1.Pod, key []byte) (port int, token string, err error) {
	for _, c := range pod.Spec.InitContainers {
		if c.Name != inject.SidecarName {
			continue
		}
		for _, p := range c.Ports {
			if p.Name == inject.ControlPortName {
				port = int(p.ContainerPort)
			}
		}
		if port == 0 {
			return 0, "", fmt.Errorf("pod %s/%s: its sidecar has no %s port", pod.Namespace, pod.Name, inject.ControlPortName)
		}
		if len(key) == 0 {
			return port, "", fmt.Errorf("pod %s/%s: no signing key to derive namespace %s's control token from", pod.Namespace, pod.Name, pod.Namespace)
		}
		return port, control.TokenFor(key, pod.Namespace), nil
	}
	return 0, "", fmt.Errorf("pod %s/%s has no ms2m sidecar: opt it in with %s: \"true\" and recreate it", pod.Namespace, pod.Name, contract.AnnotationInject)
}

// SidecarGiven returns what pod's sidecar was given, as the kubelet gives
// it: its control port and the token from the Secret its
// MS2M_CONTROL_TOKEN refers to. Tests and simulated nodes use it; the
// controller uses SidecarControl.
func SidecarGiven(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) (port int, token string, err error) {
	for _, c := range pod.Spec.InitContainers {
		if c.Name != inject.SidecarName {
			continue
		}
		for _, p := range c.Ports {
			if p.Name == inject.ControlPortName {
				port = int(p.ContainerPort)
			}
		}
		for _, e := range c.Env {
			if e.Name != "MS2M_CONTROL_TOKEN" {
				continue
			}
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				return port, e.Value, nil
			}
			ref := e.ValueFrom.SecretKeyRef
			s, err := cs.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if err != nil {
				return port, "", fmt.Errorf("the sidecar's control token: Secret %s/%s: %w", pod.Namespace, ref.Name, err)
			}
			v, ok := s.Data[ref.Key]
			if !ok {
				return port, "", fmt.Errorf("the sidecar's control token: Secret %s/%s has no key %q", pod.Namespace, ref.Name, ref.Key)
			}
			return port, string(v), nil
		}
		return port, "", fmt.Errorf("pod %s/%s: its sidecar has no MS2M_CONTROL_TOKEN", pod.Namespace, pod.Name)
	}
	return 0, "", fmt.Errorf("pod %s/%s has no ms2m sidecar: opt it in with %s: \"true\" and recreate it", pod.Namespace, pod.Name, contract.AnnotationInject)
}
