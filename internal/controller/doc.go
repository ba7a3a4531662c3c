// Package controller is the migrator's controller (`migrator controller`):
// it acts on pods annotated with ms2m.io/migrate-to, runs the migration
// with internal/migrate, and records its phase and timings in the pod's
// ms2m.io/migration-status annotation (and the target's), with Events. A
// migration found running when a controller starts (its predecessor was
// killed) is rolled back: the source is resumed and serves, the half-made
// target is deleted. A restored pod whose app container restarted has its
// state rebuilt (rebuild.go); one operation per pod at a time, so a
// migration request on it waits for the rebuild and is carried over to
// the pod that serves after it.
package controller
