package controller

import "github.com/ms2m/ms2m/internal/contract"

// A request is the pod's ms2m.io/migrate-to annotation. The controller
// answers each request once, and removes the annotation with the same
// write that records its answer (the migration's outcome, or why it was
// refused) in ms2m.io/migration-status: whatever is left in migrate-to is
// a request not answered yet. So a pod moves on as often as it is asked
// to, whatever became of the previous request, and a request for the same
// target again (after a failure, say) is simply made again.

// Action is what Reconcile does about a pod with a migration request.
type Action string

const (
	// ActNone: no request.
	ActNone Action = "none"
	// ActWait: this process drives the pod's migration; look again later.
	ActWait Action = "wait"
	// ActRollBack: the status says Running but no one here drives it (the
	// migrator that did was killed): roll it back, or complete it.
	ActRollBack Action = "roll back"
	// ActBusy: a new request while a migration of the pod runs (or while
	// the pod is a running migration's target): refused, with an Event.
	ActBusy Action = "busy"
	// ActBadStatus: the status annotation is not the migrator's JSON.
	ActBadStatus Action = "bad status"
	// ActSameNode: the pod already runs on the node asked for.
	ActSameNode Action = "same node"
	// ActMigrate: a new request for another node: check it and migrate.
	ActMigrate Action = "migrate"
)

// situation is what decide needs to know about a pod.
type situation struct {
	node      string // the node the pod runs on ("" if not scheduled)
	asked     bool   // the pod has ms2m.io/migrate-to
	migrateTo string
	hasStatus bool
	statusBad bool // the status does not decode
	status    Status
	// ours: this process drives status.Name.
	ours bool
	// targetOfOurs: the pod is the target (or shadow) of a migration this
	// process drives.
	targetOfOurs bool
}

// decide is the controller's answer to a pod's request, from what the pod
// says and what this process drives. Pure.
func decide(s situation) Action {
	switch {
	case !s.asked:
		return ActNone
	case s.hasStatus && s.statusBad:
		return ActBadStatus
	case s.hasStatus && s.status.Phase == contract.PhaseRunning && s.ours && s.migrateTo != s.status.Target:
		return ActBusy
	case s.hasStatus && s.status.Phase == contract.PhaseRunning && s.ours:
		return ActWait
	case s.hasStatus && s.status.Phase == contract.PhaseRunning:
		return ActRollBack
	case s.targetOfOurs:
		return ActBusy
	case s.migrateTo != "" && s.migrateTo == s.node:
		return ActSameNode
	}
	// Any other request is new, whatever the last one's outcome: answered
	// requests are removed with their answer.
	return ActMigrate
}
