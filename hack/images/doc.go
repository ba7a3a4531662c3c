// Command images builds the project's container images without a container
// engine, pushes them, turns kubelet checkpoint archives into checkpoint
// images, and serves a registry for local nodes to pull from. It is a thin
// command line over internal/ociimage; run it from inside the checkout:
//
//	images build -o DIR [-tag dev] [-only sidecar,pause] [-platforms linux/amd64,linux/arm64]
//	images push -registry HOST:PORT -from DIR [-insecure] [-auth FILE] [-only ...]
//	images inspect -ref REF [-insecure] [-auth FILE]
//	images checkpoint -archive FILE -container NAME -ref REF [-insecure] [-auth FILE] [-o FILE] [-no-push]
//	images registry -addr ADDR -dir DIR [-quiet]
//
// build makes the Go images from static binaries, and consumer-python from
// the host's Debian python3 and python3-pika (skipped with a note when they
// are missing). ms2m's own images (sidecar, webhook, migrator) are built,
// with CGO_ENABLED=0, for each of -platforms (default linux/amd64 and
// linux/arm64) and kept as one OCI image index, so that a node of either
// architecture pulls its own by the same reference; the others are
// linux/amd64 images. It writes DIR/<name>.tar (docker-archive, for `ctr
// images import`; it holds one image, the host's platform's if built),
// DIR/oci (one OCI layout with every image and index, which push reads so
// that the pushed digests are the built ones) and DIR/images.json, and
// prints a table of name, ref, digest, size and platforms. inspect reads a
// pushed reference back: each platform, its digest, its config's os/arch
// and its entrypoint's ELF machine, and fails on one that does not fit.
package main
