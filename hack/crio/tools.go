//go:build tools

// Package tools pins CRI-O, the second container runtime a real node of the
// local cluster can run (`make crio-bin`). Nothing imports it; the build tag
// keeps it out of every ordinary build.
package tools

import (
	_ "github.com/cri-o/cri-o/cmd/crio"
)
