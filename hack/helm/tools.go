//go:build tools

// Package tools pins the helm command line that `make helm-bin` builds into
// bin/helm, from the same Helm module the chart's tests (./charttest) use.
// Nothing imports it; the build tag keeps it out of ordinary builds.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
