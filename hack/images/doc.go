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
// build writes DIR/<name>.tar (docker-archive, for `ctr images import`),
// DIR/oci (one OCI layout with every image, which push reads so that the
// pushed digests are the built ones) and DIR/images.json, and prints a table
// of name, ref, digest and size.
package main
