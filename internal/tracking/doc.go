// Package tracking keeps the sidecar's per-queue bookkeeping: the last
// delivered and acked IDs, the deliveries in flight, and live estimates of
// the arrival rate λ and the processing rate μ that the migrator uses to
// size a cutoff. It is pure: callers pass the time in.
package tracking
