//go:build tools

// Package tools pins the container runtime of a real node: containerd, its
// ctr client and the runc shim (`make node-bin`). Nothing imports it; the
// build tag keeps it out of every ordinary build.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
