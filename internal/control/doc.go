// Package control is the sidecar's HTTP control API, on a port of its own
// apart from the AMQP listener. The migrator uses it to read the sidecar's
// state, quiesce it for a checkpoint, resume it, and stop it at a cutoff.
// Every call but /healthz, /readyz and /metrics needs the bearer token.
package control
