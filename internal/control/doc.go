// Package control is the sidecar's HTTP control API, on a port of its own
// apart from the AMQP listener, and both of its ends: the server (Handler,
// over a Sidecar) and the migrator's typed Client, with the handover and
// the waits built on it, and TokenFor, each namespace's bearer token. The request and response types (State, Cut,
// StopResult, Timings...) are declared once here, so that the compiler
// checks the API between the sidecar and the migrator.
//
// The migrator uses it to read the sidecar's state, quiesce it for a
// checkpoint, resume it, and stop it at a cutoff. Every call but /healthz,
// /readyz and /metrics needs the bearer token.
//
// A quiesce answers with a hold: a random ID of that quiesce. POST
// /resume?hold=ID resumes only a sidecar that is still quiesced under that
// hold and answers 409 Conflict otherwise (the sidecar restarted, or was
// resumed, stopped or quiesced again since): a checkpoint taken under a
// hold that did not last may hold deliveries after its checkpoint ID, and
// the migrator discards it. POST /resume without a hold, as callers before
// holds sent it, resumes a quiesced or stopped sidecar and answers OK on a
// serving one, as it always did.
package control
