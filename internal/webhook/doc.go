// Package webhook is the ms2m admission webhook around the pure mutation
// logic in internal/inject. Its Handler decodes a pod from an admission
// request, reads what Inject needs from the API server (the namespace's
// labels, and for a StatefulSet pod the pending migration the migrator left
// in a ConfigMap), calls inject.Inject, and answers with a JSON patch that
// controller-runtime computes from the mutated copy. It also emits Events,
// records Prometheus metrics, and holds the binary's wiring (Config, Run,
// and the self-signed TLS bootstrap); cmd/webhook is a thin main around Run.
// docs/webhook.md describes the behaviour and every setting.
package webhook
