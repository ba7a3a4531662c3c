package hashchain

import (
	"crypto/sha256"
	"encoding/hex"
)

// Chain is a hash chain. The zero value is h0. It is not safe for concurrent
// use.
type Chain struct {
	h [sha256.Size]byte
}

// Fold advances the chain by one body: h = SHA256(h || body).
func (c *Chain) Fold(body []byte) {
	d := sha256.New()
	d.Write(c.h[:])
	d.Write(body)
	d.Sum(c.h[:0])
}

// Hex returns the current hash as 64 lowercase hex digits.
func (c *Chain) Hex() string {
	return hex.EncodeToString(c.h[:])
}
