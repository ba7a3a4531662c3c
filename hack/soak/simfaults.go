package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/simcluster"
)

// nodeFaults are the faults of a node's processes and of the broker,
// which armNodeFault sets up.
var nodeFaults = map[string]bool{
	faultAgentCheckpoint: true, faultAgentImage: true, faultAgentPull: true, faultBroker: true, faultBrokerReplay: true,
	faultKubeletSource: true, faultKubeletTarget: true, faultSourceApp: true, faultSourceSidecar: true,
}

// nodeFault is an armed node fault. A held one fires at reached (fire,
// then release lets the held step go on); a timed one fires by itself
// d.after from arming. Either way what it took away comes back d.delay
// after it fired, or at heal, which says whether the fault never fired
// (timed ones only: a held one that never fired is the caller's to note).
type nodeFault struct {
	reached <-chan struct{}
	fire    func()
	release func()
	heal    func() (missed bool)
}

// window is a fault's time: taken away when it fires, back d.delay later
// or at heal, whichever comes first.
type window struct {
	mu    sync.Mutex
	undo  func()
	fired bool
	delay time.Duration
}

// take fires f, which returns what brings back what it took (nil: it
// could not fire, say the pod was gone: missed).
func (w *window) take(f func() func()) {
	u := f()
	if u == nil {
		return
	}
	w.mu.Lock()
	w.undo, w.fired = u, true
	w.mu.Unlock()
	time.AfterFunc(w.delay, func() { w.heal() })
}

// heal brings back what was taken, once, and says whether the fault never
// fired.
func (w *window) heal() (missed bool) {
	w.mu.Lock()
	u, fired := w.undo, w.fired
	w.undo = nil
	w.mu.Unlock()
	if u != nil {
		u()
	}
	return !fired
}

// armNodeFault arms d.fault, a node fault, for the migration of w's pod
// src from node from to node dst.
func (s *sim) armNodeFault(ctx context.Context, d draw, w *simWorkload, src *corev1.Pod, from, dst *simcluster.Node) nodeFault {
	win := &window{delay: d.delay}
	held := func(n *simcluster.Node, step simcluster.Step, f func() func()) nodeFault {
		h := n.HoldStep(step)
		return nodeFault{reached: h.Reached, fire: func() { win.take(f) }, release: h.Release, heal: func() bool { win.heal(); return false }}
	}
	timed := func(f func() func()) nodeFault {
		t := time.AfterFunc(d.after, func() { win.take(f) })
		return nodeFault{heal: func() bool { t.Stop(); return win.heal() }}
	}
	broker := func() func() { return s.c.CutBroker() }
	switch d.fault {
	case faultAgentCheckpoint:
		return held(from, simcluster.StepCheckpoint, s.killAgent(from))
	case faultAgentImage:
		return held(from, simcluster.StepImage, s.killAgent(from))
	case faultAgentPull:
		return held(dst, simcluster.StepPull, s.killAgent(dst))
	case faultSourceApp:
		sp := from.Pod(w.ns, src.Name)
		if sp == nil || !sp.Restored {
			// A source that was not restored comes back empty: its state
			// is lost by the crash, whatever a migration does.
			return nodeFault{heal: func() bool { return true }}
		}
		return held(from, simcluster.StepImage, func() func() {
			if err := from.RestartApp(ctx, w.ns, src.Name); err != nil {
				s.say("kill the source's app: %v", err)
			}
			return func() {}
		})
	case faultBrokerReplay:
		dst.HoldReplays(true)
		ch, stop := make(chan struct{}), make(chan struct{})
		go watchReplaying(dst, w.ns, ch, stop)
		var once sync.Once
		return nodeFault{reached: ch, fire: func() { win.take(broker) }, release: func() { once.Do(func() { close(stop); dst.HoldReplays(false) }) },
			heal: func() bool { win.heal(); return false }}
	case faultBroker:
		return timed(broker)
	case faultKubeletSource:
		return timed(s.stopKubelet(from))
	case faultKubeletTarget:
		return timed(s.stopKubelet(dst))
	case faultSourceSidecar:
		return timed(s.killSidecar(ctx, from, w.ns, src.Name))
	}
	panic(fmt.Sprintf("armNodeFault: %q is not a node fault", d.fault))
}

// killAgent kills n's agent; what it returns starts a new one.
func (s *sim) killAgent(n *simcluster.Node) func() func() {
	return func() func() {
		restart := n.KillAgent()
		return func() {
			if err := restart(); err != nil {
				s.say("restart the agent on %s: %v", n.Name, err)
			}
		}
	}
}

// stopKubelet stops n's kubelet; what it returns starts it again.
func (s *sim) stopKubelet(n *simcluster.Node) func() func() {
	return func() func() {
		start := n.StopKubelet()
		return func() {
			if err := start(); err != nil {
				s.say("start the kubelet on %s: %v", n.Name, err)
			}
		}
	}
}

// killSidecar kills the sidecar of pod ns/name on n (nil if the pod is
// gone); what it returns restarts it.
func (s *sim) killSidecar(ctx context.Context, n *simcluster.Node, ns, name string) func() func() {
	return func() func() {
		restart, err := n.KillSidecar(ctx, ns, name)
		if err != nil {
			s.say("kill the source's sidecar: %v", err)
			return nil
		}
		return func() {
			if err := restart(context.WithoutCancel(ctx)); err != nil {
				s.say("restart the source's sidecar: %v", err)
			}
		}
	}
}

// fresh replaces w, whose pod may have been restored, with a new workload
// of its kind, and deletes w's namespace: its pod was exact (a workload
// that is not is dropped at once and kept for a look).
//
// The simulated cluster runs no garbage collector or namespace controller,
// and its nodes have 60 addresses: the workload's controller and pods are
// deleted one by one.
func (s *sim) fresh(ctx context.Context, w *simWorkload) (*simWorkload, error) {
	s.replace(w)
	apps, core := s.c.Client.AppsV1(), s.c.Client.CoreV1()
	all := metav1.ListOptions{}
	for _, err := range []error{
		apps.Deployments(w.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all),
		apps.ReplicaSets(w.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all),
		apps.StatefulSets(w.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all),
		core.Pods(w.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all),
		core.Namespaces().Delete(ctx, w.ns, metav1.DeleteOptions{}),
	} {
		if err != nil {
			s.say("remove the workload in %s: %v", w.ns, err)
		}
	}
	return s.workload(ctx, w.kind)
}
