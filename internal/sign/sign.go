package sign

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
)

// MinKeyLen is the shortest key accepted: 16 bytes.
const MinKeyLen = 16

// MAC is the HMAC-SHA256 with key over context and parts, base64url
// without padding. Each string is length-prefixed before it is hashed, so
// no two different lists of parts sign alike, whatever bytes they hold.
func MAC(key []byte, context string, parts ...string) string {
	m := hmac.New(sha256.New, key)
	var n [binary.MaxVarintLen64]byte
	for _, s := range append([]string{context}, parts...) {
		m.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		m.Write([]byte(s))
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Valid says whether mac is MAC(key, context, parts...), comparing in
// constant time. An empty key or mac is never valid.
func Valid(key []byte, mac, context string, parts ...string) bool {
	if len(key) == 0 || mac == "" {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(MAC(key, context, parts...)))
}

// NewKey returns a new random key as text (32 random bytes, base64url):
// text, so that it reads the same from a Secret's data, an environment
// variable and a mounted file.
func NewKey() ([]byte, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("a new signing key: %w", err)
	}
	return []byte(base64.RawURLEncoding.EncodeToString(b)), nil
}

// Check says what is wrong with key, if anything.
func Check(key []byte) error {
	if len(key) < MinKeyLen {
		return fmt.Errorf("the signing key is %d bytes: use at least %d", len(key), MinKeyLen)
	}
	return nil
}

// ReadKeyFile reads a key from a file (a mounted Secret), without the
// white space around it, and checks it.
func ReadKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the signing key: %w", err)
	}
	key := []byte(strings.TrimSpace(string(b)))
	if err := Check(key); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return key, nil
}
