// Package hashchain is the state the sample apps compute: a SHA-256 hash
// chain folded over message bodies in the order they are processed.
//
//	h0 = 32 zero bytes
//	hi = SHA256(h(i-1) || body_i)
//
// The producer folds the bodies it sent and a consumer the bodies it
// processed; equal hashes mean every message was processed exactly once, in
// order. The Python consumer implements the same definition independently.
package hashchain
