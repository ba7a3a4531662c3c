// Package sidecar wires the sidecar together: it reads the configuration,
// opens the replay log, starts the Tee, the AMQP proxy and the control API,
// and shuts them down in order. cmd/sidecar is a thin main around Run.
package sidecar
