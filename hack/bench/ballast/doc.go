// Command ballast is the app of the bench's criu part: a process whose
// resident memory is a known size and nothing else. It allocates
// BALLAST_MB MiB, writes pseudo-random bytes to every page of it (so that
// every page is resident and dirty, and nothing compresses it away), prints
// one line with its resident set size, then "ready", and sleeps until
// SIGTERM or SIGINT, when it exits 0. It opens no socket and no listener,
// so CRIU can dump it anywhere; build it static (CGO_ENABLED=0) to run it
// as a container image's only file.
package main
