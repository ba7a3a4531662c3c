// Package replay is the target side of a handoff. A Source follows a pod's
// replay log and collects, per queue, the deliveries with IDs in
// (start, cutoff], where the cutoff is either known up front or learned from
// the cutoff marker that the source sidecar's stop appends. The proxy feeds
// those records to the restored app as ordinary deliveries, and switches the
// app to the primary queue once it has acked the last of them.
package replay
