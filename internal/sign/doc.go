// Package sign makes and checks the HMAC-SHA256 signatures by which ms2m's
// controller vouches for what it writes where a tenant can write too: the
// migration statuses on a tenant's pods (internal/controller) and the
// restore instructions on target pods and pending-migration ConfigMaps
// (internal/inject checks them in the webhook). One key signs both, each
// under its own context string, so that a signature made for one can never
// pass as the other. docs/security.md has the threat model.
package sign
