package contract

// Event reasons, Normal and Warning alike, CamelCase. Each constant is
// named Reason and its value.

// The webhook's Events: on the pod's controller for a CREATE (the pod has
// no UID yet), on the pod for an UPDATE.
const (
	ReasonInjected = "Injected" // Normal: the sidecar was added
	ReasonRestored = "Restored" // Normal: the pod was turned into a restore
	ReasonSkipped  = "Skipped"  // Normal: the pod asked for ms2m but was left alone
	ReasonDenied   = "Denied"   // Warning: the request was denied (bad ms2m annotations)
	// ReasonEvictionRefused (Normal, on the pod): an eviction of a pod
	// opted in by ms2m.io/on-evict was refused with 429, since the pod is
	// to migrate instead.
	ReasonEvictionRefused = "EvictionRefused"
)

// WebhookReasons are the reasons of the webhook's Events.
var WebhookReasons = []string{ReasonInjected, ReasonRestored, ReasonSkipped, ReasonDenied, ReasonEvictionRefused}

// The migrator's controller's Events, on the pod that asked (and on the
// target it made, for MigrationSucceeded).
const (
	ReasonMigrationStarted   = "MigrationStarted"   // Normal: a request was accepted and the migration begins
	ReasonMigrationPhase     = "MigrationPhase"     // Normal: one phase of it ended, with its time
	ReasonMigrationSucceeded = "MigrationSucceeded" // Normal: the target serves
	ReasonMigrationFailed    = "MigrationFailed"    // Warning: the migration failed; the source serves
	ReasonMigrationRejected  = "MigrationRejected"  // Warning: bad input; nothing was touched
	// ReasonMigrationTargetNotAllowed (Warning): a request refused because
	// the pod's node selector, required node affinity or the target's
	// taints keep it off the target.
	ReasonMigrationTargetNotAllowed = "MigrationTargetNotAllowed"
	// ReasonMigrationNodeNotCapable (Warning): a request refused before
	// anything was done because the source's node cannot checkpoint or
	// the target's cannot restore (its agent's preflight says so).
	ReasonMigrationNodeNotCapable    = "MigrationNodeNotCapable"
	ReasonMigrationInProgress        = "MigrationInProgress"        // Warning: a request refused because one runs
	ReasonMigrationRolledBack        = "MigrationRolledBack"        // Warning: a migration no replica drove was undone
	ReasonMigrationRollbackFailed    = "MigrationRollbackFailed"    // Warning: undoing it failed; retried
	ReasonMigrationRollForwardFailed = "MigrationRollForwardFailed" // Warning: completing one whose target took over failed; retried
	ReasonMigrationContinued         = "MigrationContinued"         // Normal: a restarted controller goes on from a statefulset-shadow's shadow
	ReasonMigrationPending           = "MigrationPending"           // Warning: a StatefulSet's restored pod does not run; its ConfigMap stays
	// ReasonMigrationRestoreRedone (Warning, on the pending-migration
	// ConfigMap): a StatefulSet's restored pod that could not end its
	// replay exactly (interrupted, or its shadow died before its cutoff)
	// was deleted, for its StatefulSet to make it again as the restore.
	ReasonMigrationRestoreRedone = "MigrationRestoreRedone"
	// ReasonAppRestarted (Warning, on a restored pod that serves): its app
	// container restarted, and so came back from the checkpoint image
	// without what it processed since; its sidecar was stopped (it
	// consumes nothing) and its state is being rebuilt from the log.
	ReasonAppRestarted = "AppRestarted"
	// ReasonStateRebuilt (Normal, on the restarted pod and its
	// replacement): a new restore of the same checkpoint replayed the
	// log to the stopped sidecar's cutoff and serves with the exact
	// state.
	ReasonStateRebuilt = "StateRebuilt"
	// ReasonStateNotRebuilt (Warning, on the restarted pod): its state
	// could not be rebuilt; its sidecar stays stopped, so that nothing is
	// consumed on the wrong state, and the pod carries the condition
	// ConditionStateNotRebuilt. Retried unless the log no longer holds the
	// records after the checkpoint.
	ReasonStateNotRebuilt = "StateNotRebuilt"
	// ReasonForgedMigrationStatus (Warning): the pod's migration status is
	// not signed by the controller's key; it is ignored (no rollback, no
	// image deletion).
	ReasonForgedMigrationStatus = "ForgedMigrationStatus"
	// ReasonEvacuationTarget (Normal): the scheduler placed an evacuated
	// pod's placeholder; its node is the migration's target.
	ReasonEvacuationTarget = "EvacuationTarget"
	// ReasonEvacuationWaiting (Normal): an evacuation waits for a
	// concurrency limit or a PodDisruptionBudget, or for the scheduler.
	ReasonEvacuationWaiting = "EvacuationWaiting"
	// ReasonMigrationWaiting (Normal): a request waits for the rebuild of
	// the pod's state (its app restarted) to end, and then runs against
	// the pod that serves with the rebuilt state (carried over to it).
	ReasonMigrationWaiting = "MigrationWaiting"
)

// ControllerReasons are the reasons of the controller's Events.
var ControllerReasons = []string{
	ReasonMigrationStarted,
	ReasonMigrationPhase,
	ReasonMigrationSucceeded,
	ReasonMigrationFailed,
	ReasonMigrationRejected,
	ReasonMigrationTargetNotAllowed,
	ReasonMigrationNodeNotCapable,
	ReasonMigrationInProgress,
	ReasonMigrationRolledBack,
	ReasonMigrationRollbackFailed,
	ReasonMigrationRollForwardFailed,
	ReasonMigrationContinued,
	ReasonMigrationPending,
	ReasonMigrationRestoreRedone,
	ReasonAppRestarted,
	ReasonStateRebuilt,
	ReasonStateNotRebuilt,
	ReasonForgedMigrationStatus,
	ReasonEvacuationTarget,
	ReasonEvacuationWaiting,
	ReasonMigrationWaiting,
}
