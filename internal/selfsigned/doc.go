// Package selfsigned makes a throwaway certificate authority and a serving
// certificate signed by it, in memory, PEM encoded: for the webhook's
// self-signed bootstrap and its renewal, and for the simulated kubelets of
// internal/simcluster. Keys are ECDSA P-256. A CA that must outlive a
// process and be shared between components (the local cluster's, in
// e2e/cluster) is a different job and lives there.
package selfsigned
