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

// armNodeFault arms d.fault, a node fault, for the migration of w's pod
// src from node from to node dst.
func (s *sim) armNodeFault(ctx context.Context, d draw, w *simWorkload, src *corev1.Pod, from, dst *simcluster.Node) nodeFault {
	var mu sync.Mutex
	var undo func()
	fired := false
	take := func(f func() func()) {
		u := f()
		if u == nil {
			return // it could not fire (the pod was gone): missed
		}
		mu.Lock()
		undo, fired = u, true
		mu.Unlock()
		time.AfterFunc(d.delay, func() {
			mu.Lock()
			u := undo
			undo = nil
			mu.Unlock()
			if u != nil {
				u()
			}
		})
	}
	heal := func() bool {
		mu.Lock()
		u, f := undo, fired
		undo = nil
		mu.Unlock()
		if u != nil {
			u()
		}
		return !f
	}
	agent := func(n *simcluster.Node) func() func() {
		return func() func() {
			restart := n.KillAgent()
			return func() {
				if err := restart(); err != nil {
					s.say("restart the agent on %s: %v", n.Name, err)
				}
			}
		}
	}
	kubelet := func(n *simcluster.Node) func() func() {
		return func() func() {
			start := n.StopKubelet()
			return func() {
				if err := start(); err != nil {
					s.say("start the kubelet on %s: %v", n.Name, err)
				}
			}
		}
	}
	broker := func() func() { return s.c.CutBroker() }
	held := func(n *simcluster.Node, step simcluster.Step, f func() func()) nodeFault {
		h := n.HoldStep(step)
		return nodeFault{reached: h.Reached, fire: func() { take(f) }, release: h.Release, heal: func() bool { heal(); return false }}
	}
	timed := func(f func() func()) nodeFault {
		t := time.AfterFunc(d.after, func() { take(f) })
		return nodeFault{heal: func() bool { t.Stop(); return heal() }}
	}
	switch d.fault {
	case faultAgentCheckpoint:
		return held(from, simcluster.StepCheckpoint, agent(from))
	case faultAgentImage:
		return held(from, simcluster.StepImage, agent(from))
	case faultAgentPull:
		return held(dst, simcluster.StepPull, agent(dst))
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
		return nodeFault{reached: ch, fire: func() { take(broker) }, release: func() { once.Do(func() { close(stop); dst.HoldReplays(false) }) },
			heal: func() bool { heal(); return false }}
	case faultBroker:
		return timed(broker)
	case faultKubeletSource:
		return timed(kubelet(from))
	case faultKubeletTarget:
		return timed(kubelet(dst))
	case faultSourceSidecar:
		return timed(func() func() {
			restart, err := from.KillSidecar(ctx, w.ns, src.Name)
			if err != nil {
				s.say("kill the source's sidecar: %v", err)
				return nil
			}
			return func() {
				if err := restart(context.WithoutCancel(ctx)); err != nil {
					s.say("restart the source's sidecar: %v", err)
				}
			}
		})
	}
	panic(fmt.Sprintf("armNodeFault: %q is not a node fault", d.fault))
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
