// Package ociimage builds, writes, pushes and serves OCI images without a
// container engine. App turns static Go binaries into a small linux image
// (amd64 or arm64) on an empty base, and Index puts such images of one
// program, one per platform, into one OCI image index (ParsePlatforms and
// DefaultPlatforms say which; InspectIndex reads one back); Files copies
// host files into an image of the same shape (its debianpy package picks
// Debian's own python3, the libraries it loads and chosen dist-packages);
// Checkpoint wraps a kubelet checkpoint archive, as is, into the
// single-layer image that containerd and CRI-O restore from; WriteTarball,
// WriteOCILayout, WriteOCILayoutIndex and WriteOCIArchive write images for
// `ctr images import`; Push and PushIndex send them to a registry; and
// ServeRegistry runs an in-process registry that keeps blobs on disk, for
// nodes to pull from over plain HTTP. Everything is built on
// go-containerregistry, and the layers this package makes are
// reproducible: the same inputs give the same digests.
package ociimage
