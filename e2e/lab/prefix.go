package lab

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrNotPrefix is the error of CheckPrefix: the consumer's state is not
// that of msg-1 .. msg-n folded once each, in order.
var ErrNotPrefix = errors.New("not an exact prefix of the producer's messages")

// PrefixHash is the hash chain of the sample producer's first n bodies,
// msg-1 .. msg-n (no padding), as the sample consumers fold it: h0 is 32
// zero bytes and h(i) = SHA-256(h(i-1) || body(i)). It is written here
// afresh, not taken from the examples, so that the oracle and the apps it
// judges do not share code.
func PrefixHash(n int) string {
	h := make([]byte, sha256.Size)
	for i := 1; i <= n; i++ {
		d := sha256.New()
		d.Write(h)
		d.Write([]byte("msg-" + strconv.Itoa(i)))
		h = d.Sum(h[:0])
	}
	return hex.EncodeToString(h)
}

// CheckPrefix checks that st is a consumer that has folded msg-1 ..
// msg-n exactly once each, in order and nothing else, where n is its
// count; it can be called at any time while the producer still sends. The
// error wraps ErrNotPrefix and says whether messages look lost (the last
// folded is further on than the count) or doubled (the count is further on
// than the last, or the hash differs where the two agree).
func CheckPrefix(st AppState) error {
	if st.Skipped != 0 {
		return fmt.Errorf("%w: %d redeliveries skipped (the hash cannot show a duplicate it skipped)", ErrNotPrefix, st.Skipped)
	}
	if st.Count == 0 {
		if st.Last != "" || st.Hash != PrefixHash(0) {
			return fmt.Errorf("%w: no message counted, but last %q and hash %s", ErrNotPrefix, st.Last, st.Hash)
		}
		return nil
	}
	last, ok := strings.CutPrefix(st.Last, "msg-")
	n, err := strconv.Atoi(last)
	if !ok || err != nil || n < 1 {
		return fmt.Errorf("%w: the last message folded is %q, not one of the producer's", ErrNotPrefix, st.Last)
	}
	switch {
	case n > st.Count:
		return fmt.Errorf("%w: lost: %d messages folded, the last msg-%d", ErrNotPrefix, st.Count, n)
	case n < st.Count:
		return fmt.Errorf("%w: doubled: %d messages folded, the last msg-%d", ErrNotPrefix, st.Count, n)
	}
	if want := PrefixHash(n); st.Hash != want {
		return fmt.Errorf("%w: doubled and lost: %d messages folded up to msg-%d, but the hash %s is not that of msg-1..msg-%d (%s)", ErrNotPrefix, n, n, st.Hash, n, want)
	}
	return nil
}

// PrefixFault classifies a CheckPrefix error: "lost", "doubled", or ""
// for nil.
func PrefixFault(err error) string {
	switch {
	case err == nil:
		return ""
	case strings.Contains(err.Error(), ": lost: "):
		return "lost"
	default:
		return "doubled"
	}
}
