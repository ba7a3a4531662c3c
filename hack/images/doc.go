// Command images builds the project's container images without a container
// engine, pushes them, turns kubelet checkpoint archives into checkpoint
// images, and serves a registry for local nodes to pull from. It is a thin
// command line over internal/ociimage; run it from inside the checkout:
//
//	images build -o DIR [-tag dev] [-only sidecar,pause]
//	images push -registry HOST:PORT -from DIR [-insecure] [-auth FILE] [-only ...]
//	images checkpoint -archive FILE -container NAME -ref REF [-insecure] [-auth FILE] [-o FILE] [-no-push]
//	images registry -addr ADDR -dir DIR [-quiet]
//
// build makes the Go images from static binaries, and consumer-python from
// the host's Debian python3 and python3-pika (skipped with a note when they
// are missing). It writes DIR/<name>.tar (docker-archive, for `ctr images
// import`), DIR/oci (one OCI layout with every image, which push reads so that the
// pushed digests are the built ones) and DIR/images.json, and prints a table
// of name, ref, digest and size.
package main
