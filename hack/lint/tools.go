//go:build tools

// Package tools pins the golangci-lint command line that `make lint-bin`
// builds into bin/golangci-lint. Nothing imports it; the build tag keeps it
// out of ordinary builds.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
)
