// Package soak is the bookkeeping of `make soak` (hack/soak): long runs of
// migrations, one JSON record per migration appended to a file per mode
// (pingpong.jsonl, sim.jsonl, ...) in an output folder that one run at a
// time holds under a file lock; a run counts what the folder already holds
// and goes on to its count, chunk by chunk (Run, over a Mode); and the
// summary of such a folder, per mode and strategy, with the outcome counts
// and the p50 and p95 of the totals and processing gaps. It is pure apart
// from the files: the modes, which drive real migrations, live in
// hack/soak.
package soak
