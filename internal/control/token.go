package control

import "github.com/ms2m/ms2m/internal/sign"

// A sidecar's control token is its namespace's, derived from the
// controller's key (the Secret ms2m-migration-status-key): HMAC-SHA256 over
// the namespace. Each namespace's differs from every other's, whatever an
// operator does; the webhook writes it into the Secret that the namespace's
// sidecars read (MS2M_CONTROL_TOKEN), and the controller and the CLI
// compute it from the key instead of reading any Secret. A tenant who reads
// its own namespace's token learns nothing of another's.
const tokenContext = "ms2m.io/control-token/v1"

// TokenFor is the control token of the sidecars in namespace, under the
// controller's key.
func TokenFor(key []byte, namespace string) string {
	return sign.MAC(key, tokenContext, namespace)
}
