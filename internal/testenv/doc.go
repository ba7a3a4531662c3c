// Package testenv finds the real components that integration tests run
// against (the broker, its stream port and management API, Debian's pika,
// a test control plane) and builds the sample apps. A missing component
// fails the test under CI=true and skips it, loudly, elsewhere. Only tests
// import it.
package testenv
