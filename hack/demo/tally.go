package main

import (
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"

	"github.com/ms2m/ms2m/e2e/lab"
)

// The consumers keep no list of what they processed, only the hash chain
// over it, its length and the last body (AppState: count, hash, last). So
// lost and duplicated messages are derived, not read.
//
// The producer sent msg-1 … msg-N in order. A migration goes wrong in one
// way: the restored consumer starts from the state the source had folded,
// msg-1 … msg-k, and goes on from some msg-b instead of msg-(k+1); b above
// k+1 skips (loses) messages, b at or below k processes some twice. Its
// state then says it folded count = k + (L − b + 1) messages, the last
// msg-L. For each k, b follows from count and L; tally folds the chain over
// msg-1 … msg-k, msg-b … msg-L and compares it with the consumer's hash.
// The one k that matches gives the exact numbers: lost = N − distinct,
// duplicated = count − distinct, with distinct the messages in the union of
// the two runs. When none matches (messages reordered, or more than one
// splice), the counts give only bounds: at least N − count lost, at least
// count − N duplicated.

// tally is what the restored consumer's state says about the messages lost
// and duplicated across a migration.
type tally struct {
	lost, duplicated int
	// exact: the hash chain confirms the numbers. Otherwise they are
	// lower bounds from the counts alone.
	exact bool
}

// maxTallyWork bounds the folds tally tries (about a second of hashing);
// beyond it, it gives the bounds.
const maxTallyWork = 5_000_000

// tallyOf derives the tally of a consumer that folded got from what the
// producer sent, want (bodies msg-1 … msg-N, no padding).
func tallyOf(want lab.ProducerResult, got lab.AppState) tally {
	n, c := want.Count, got.Count
	bounds := tally{lost: max(0, n-c), duplicated: max(0, c-n)}
	if c == n && got.Hash == want.Hash {
		return tally{exact: true}
	}
	last := 0
	if got.Last != "" {
		var err error
		if last, err = strconv.Atoi(strings.TrimPrefix(got.Last, "msg-")); err != nil || !strings.HasPrefix(got.Last, "msg-") || last < 1 || last > n {
			return bounds
		}
	}
	if n*max(last, 1) > maxTallyWork {
		return bounds
	}
	// prefix[k] is the chain over msg-1 … msg-k.
	prefix := make([][sha256.Size]byte, n+1)
	for k := 1; k <= n; k++ {
		prefix[k] = fold(prefix[k-1], k)
	}
	if hexOf(prefix[n]) != want.Hash {
		return bounds // not the bodies this assumes
	}
	for k := 0; k <= n; k++ {
		b := k + last + 1 - c
		if b < 1 || b > last+1 || (b == last+1 && k != last) {
			continue
		}
		h := prefix[k]
		for i := b; i <= last; i++ {
			h = fold(h, i)
		}
		if hexOf(h) != got.Hash {
			continue
		}
		distinct := k + max(0, last-max(b, k+1)+1)
		return tally{lost: n - distinct, duplicated: c - distinct, exact: true}
	}
	return bounds
}

// fold is the sample apps' hash chain step: SHA256(h || "msg-i").
func fold(h [sha256.Size]byte, i int) [sha256.Size]byte {
	d := sha256.New()
	d.Write(h[:])
	d.Write([]byte("msg-" + strconv.Itoa(i)))
	var out [sha256.Size]byte
	d.Sum(out[:0])
	return out
}

func hexOf(h [sha256.Size]byte) string { return fmt.Sprintf("%x", h[:]) }

// cells is the tally as the table shows it: a count, or "≥n" for a bound.
func (t tally) cells() (lost, duplicated string) {
	if t.exact {
		return strconv.Itoa(t.lost), strconv.Itoa(t.duplicated)
	}
	return "≥" + strconv.Itoa(t.lost), "≥" + strconv.Itoa(t.duplicated)
}
