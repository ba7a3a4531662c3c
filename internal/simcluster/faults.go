package simcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Faults of a node's processes and of the broker, for the fault matrix
// (docs/faults.md): each takes something away and returns what brings it
// back, as a restart does.

// broker is the simulated sidecars' broker: an outage takes it away from
// every sidecar of the cluster at once, as a broker restart does.
type broker struct {
	mu   sync.Mutex
	away bool
	back chan struct{} // closed when the outage ends
}

func (b *broker) down() bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.away
}

// wait returns once the broker is there, or ctx's error.
func (b *broker) wait(ctx context.Context) error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	away, back := b.away, b.back
	b.mu.Unlock()
	if !away {
		return nil
	}
	select {
	case <-back:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the broker is unreachable: %w", ctx.Err())
	}
}

// CutBroker takes the broker away from every simulated sidecar until
// restore is called, as a broker restart does to its clients: a serving
// sidecar gets no deliveries (the queue keeps them, and they come once the
// broker is back), a replay reads nothing (it goes on from its next
// record), and a quiesce or a stop waits for the broker (the acks and the
// cutoff marker must be upstream), until its request's context ends.
// Control APIs answer throughout.
//
// The simulated sidecars are models with no connection to the shared
// RabbitMQ, which no test restarts (other processes use it): this is the
// outage as the migrator sees it. The real sidecar's reconnects after a
// broker closes its connections are tested against the real broker
// (TestSourceReconnectsAfterBrokerClose, TestTargetReaderReconnects).
func (c *Cluster) CutBroker() (restore func()) {
	b := &c.broker
	b.mu.Lock()
	if !b.away {
		b.away, b.back = true, make(chan struct{})
	}
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.away {
			b.away = false
			close(b.back)
		}
	}
}

// KillAgent kills the node's agent: its listener closes, requests in
// flight lose their connection (and do nothing more), and new ones are
// refused, until restart serves the agent again on the same address.
func (n *Node) KillAgent() (restart func() error) {
	n.mu.Lock()
	srv, stop, killed := n.asrv, n.agentStop, n.agentKilled
	n.agentKilled = true
	n.mu.Unlock()
	if !killed && srv != nil {
		srv.Close()
		stop()
	}
	return func() error {
		n.mu.Lock()
		if !n.agentKilled {
			n.mu.Unlock()
			return nil
		}
		n.agentKilled = false
		n.mu.Unlock()
		return n.serveAgent()
	}
}

// StopKubelet stops the node's kubelet until start is called: its API
// refuses connections (a checkpoint cannot be taken), pods bound to the
// node are not started, and deleted ones are not confirmed gone (they
// stay terminating). The pods that run go on running, as containers do
// without their kubelet. Once started again, the kubelet catches up with
// what changed.
func (n *Node) StopKubelet() (start func() error) {
	n.mu.Lock()
	srv, stop, done, stopped := n.ksrv, n.stop, n.done, n.kubeletStopped
	n.kubeletStopped = true
	n.mu.Unlock()
	if !stopped {
		if srv != nil {
			srv.Close()
		}
		if stop != nil {
			stop()
			<-done
		}
	}
	return func() error {
		n.mu.Lock()
		if !n.kubeletStopped {
			n.mu.Unlock()
			return nil
		}
		n.kubeletStopped = false
		n.mu.Unlock()
		if err := n.serveKubelet(); err != nil {
			return err
		}
		n.startPods()
		return nil
	}
}

// KillSidecar kills the sidecar container of pod ns/name until restart
// is called: its control API drops every request, it takes no
// deliveries, and the pod is not ready. Restarted, as the kubelet restarts
// a sidecar container, it starts as its MS2M_* variables say and knows
// nothing of what it did before (a quiesce's hold, a stop); its app went
// on running throughout.
func (n *Node) KillSidecar(ctx context.Context, ns, name string) (restart func(context.Context) error, err error) {
	sp := n.Pod(ns, name)
	if sp == nil || sp.Sidecar == nil || sp.srv == nil {
		return nil, fmt.Errorf("node %s runs no pod %s/%s with a sidecar", n.Name, ns, name)
	}
	sp.sidecarDown.Store(true)
	sp.Sidecar.close()
	if err := n.sidecarStatus(ctx, sp, false); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		if !sp.sidecarDown.Load() {
			return nil
		}
		// Under the node's lock: a pod deleted meanwhile is stopped after
		// this (gone closes its sidecar once it is out of n.pods).
		n.mu.Lock()
		there := n.pods[sp.UID] == sp
		if there {
			sp.Sidecar.restart(false)
		}
		n.mu.Unlock()
		if !there {
			return nil // the pod is gone: nothing restarts its containers
		}
		sp.sidecarDown.Store(false)
		return n.sidecarStatus(ctx, sp, true)
	}, nil
}

// RestartSidecar restarts the sidecar container of pod ns/name at once, as
// a crash the kubelet restarts it from within a moment: it starts as its
// MS2M_* variables say, and stopped if it had recorded a stop in its
// state folder.
func (n *Node) RestartSidecar(ctx context.Context, ns, name string) error {
	return n.restartSidecar(ctx, ns, name, false)
}

// RestartSidecarWithoutState is RestartSidecar for a sidecar without a
// state folder (a pod injected before MS2M_STATE_DIR): it forgets a stop,
// and serves again.
func (n *Node) RestartSidecarWithoutState(ctx context.Context, ns, name string) error {
	return n.restartSidecar(ctx, ns, name, true)
}

func (n *Node) restartSidecar(ctx context.Context, ns, name string, forget bool) error {
	sp := n.Pod(ns, name)
	if sp == nil || sp.Sidecar == nil || sp.srv == nil {
		return fmt.Errorf("node %s runs no pod %s/%s with a sidecar", n.Name, ns, name)
	}
	n.mu.Lock()
	there := n.pods[sp.UID] == sp
	if there {
		sp.Sidecar.close()
		sp.Sidecar.restart(forget)
	}
	n.mu.Unlock()
	if !there {
		return fmt.Errorf("pod %s/%s is gone", ns, name)
	}
	return n.sidecarStatus(ctx, sp, true)
}

// sidecarStatus reports sp's sidecar container as the kubelet does when it
// died (not ready) and when it runs again (ready, one more restart).
func (n *Node) sidecarStatus(ctx context.Context, sp *SimPod, running bool) error {
	pod, err := n.c.Client.CoreV1().Pods(sp.Namespace).Get(ctx, sp.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if pod.UID != sp.UID {
		return fmt.Errorf("pod %s/%s was replaced meanwhile", sp.Namespace, sp.Name)
	}
	st := *pod.Status.DeepCopy()
	cond := corev1.ConditionFalse
	if running {
		cond = corev1.ConditionTrue
	}
	for i := range st.Conditions {
		if st.Conditions[i].Type == corev1.PodReady || st.Conditions[i].Type == corev1.ContainersReady {
			st.Conditions[i].Status = cond
		}
	}
	now := metav1.Now()
	for i := range st.InitContainerStatuses {
		cs := &st.InitContainerStatuses[i]
		cs.Ready = running
		if running {
			cs.RestartCount++
			cs.ContainerID = fmt.Sprintf("sim://%s/%s-%d", sp.UID, cs.Name, cs.RestartCount)
			cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
		} else {
			cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error", Message: "killed by the test"}}
		}
	}
	return n.updateStatus(ctx, pod, st)
}

// Archives lists the checkpoint archives in the node's checkpoint folder:
// each holds a process's memory, and a migration leaves none behind.
func (n *Node) Archives() ([]string, error) {
	ents, err := os.ReadDir(n.CheckpointDir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, filepath.Join(n.CheckpointDir, e.Name()))
	}
	return out, nil
}
