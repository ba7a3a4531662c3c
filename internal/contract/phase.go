package contract

// Phase is where a requested migration is: the phase of the status in
// AnnotationMigrationStatus, and the outcome of each request in its
// history.
type Phase string

const (
	// PhaseRunning: a controller drives the migration now. A restarted
	// controller that finds one Running that no replica drives ends it
	// (rolls it back, or completes it if the target took over).
	PhaseRunning Phase = "Running"
	// PhaseSucceeded: the target serves; the source is gone or stopped.
	PhaseSucceeded Phase = "Succeeded"
	// PhaseFailed: the request was refused or the migration failed; the
	// source serves.
	PhaseFailed Phase = "Failed"
	// PhaseRolledBack: a migration a controller left Running was undone by
	// another; the source serves.
	PhaseRolledBack Phase = "RolledBack"
)

// Phases are every Phase, in the order a migration can pass them.
var Phases = []Phase{PhaseRunning, PhaseSucceeded, PhaseFailed, PhaseRolledBack}
