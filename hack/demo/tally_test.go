package main

import (
	"crypto/sha256"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/e2e/lab"
)

// consumed is the state of a consumer that folded msg-i for each i in ids.
func consumed(ids ...int) lab.AppState {
	var h [sha256.Size]byte
	st := lab.AppState{Count: len(ids)}
	for _, i := range ids {
		h = fold(h, i)
		st.Last = "msg-" + strconv.Itoa(i)
	}
	st.Hash = hexOf(h)
	return st
}

func seq(from, to int) []int {
	var s []int
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func TestTally(t *testing.T) {
	sent := consumed(seq(1, 300)...)
	want := lab.ProducerResult{Count: 300, Hash: sent.Hash}
	tests := map[string]struct {
		got  lab.AppState
		want tally
	}{
		"exact":                     {got: sent, want: tally{exact: true}},
		"gap after the checkpoint":  {got: consumed(append(seq(1, 100), seq(131, 300)...)...), want: tally{lost: 30, exact: true}},
		"run replayed twice":        {got: consumed(append(seq(1, 120), seq(101, 300)...)...), want: tally{duplicated: 20, exact: true}},
		"tail never came":           {got: consumed(seq(1, 280)...), want: tally{lost: 20, exact: true}},
		"one message twice at once": {got: consumed(append(seq(1, 1), seq(1, 300)...)...), want: tally{duplicated: 1, exact: true}},
		"nothing folded":            {got: consumed(), want: tally{lost: 300, exact: true}},
		"reordered: bounds only":    {got: consumed(append(append(seq(1, 10), 12, 11), seq(13, 300)...)...), want: tally{}},
		"two gaps: bounds only":     {got: consumed(append(append(seq(1, 10), seq(12, 20)...), seq(22, 300)...)...), want: tally{lost: 2}},
		"not the producer's bodies": {got: lab.AppState{Count: 290, Hash: "x", Last: "order-290"}, want: tally{lost: 10}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tallyOf(want, tc.got), cmp.AllowUnexported(tally{})); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// The chain is the sample apps' (examples/internal/hashchain, whose values
// came from Python's hashlib).
func TestFoldIsTheSampleAppsChain(t *testing.T) {
	var h [sha256.Size]byte
	h = fold(h, 1)
	if got := hexOf(h); got != "8d04eca07af490f36bfc4da73b228dcb8c44ad8bbe8060dffeee58ef9b34a28a" {
		t.Errorf("after msg-1: %s", got)
	}
	h = fold(h, 2)
	if got := hexOf(h); got != "22ff5d847c21b44d950a6665c14e1b012abf6f4b7e8c44b66919a106600cc9c1" {
		t.Errorf("after msg-2: %s", got)
	}
}

func TestTallyCells(t *testing.T) {
	for _, tc := range []struct {
		t         tally
		lost, dup string
	}{
		{tally{lost: 3, exact: true}, "3", "0"},
		{tally{duplicated: 2}, "≥0", "≥2"},
	} {
		l, d := tc.t.cells()
		if l != tc.lost || d != tc.dup {
			t.Errorf("%+v: cells %q %q, want %q %q", tc.t, l, d, tc.lost, tc.dup)
		}
	}
}
