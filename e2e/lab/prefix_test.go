package lab

import (
	"errors"
	"testing"
)

func TestCheckPrefix(t *testing.T) {
	// Computed with Python's hashlib, independently of this package (and
	// the same as examples/internal/hashchain's test).
	const h1 = "8d04eca07af490f36bfc4da73b228dcb8c44ad8bbe8060dffeee58ef9b34a28a"
	const h2 = "22ff5d847c21b44d950a6665c14e1b012abf6f4b7e8c44b66919a106600cc9c1"
	if got := PrefixHash(2); got != h2 {
		t.Fatalf("PrefixHash(2) = %s, want %s", got, h2)
	}
	for name, tc := range map[string]struct {
		st    AppState
		fault string // "" for an exact prefix
	}{
		"nothing yet":                {st: AppState{Hash: PrefixHash(0)}},
		"msg-1":                      {st: AppState{Count: 1, Last: "msg-1", Hash: h1}},
		"msg-1, msg-2":               {st: AppState{Count: 2, Last: "msg-2", Hash: h2}},
		"a long run":                 {st: AppState{Count: 3000, Last: "msg-3000", Hash: PrefixHash(3000)}},
		"one skipped":                {st: AppState{Count: 2, Last: "msg-3", Hash: PrefixHash(3)}, fault: "lost"},
		"one twice":                  {st: AppState{Count: 3, Last: "msg-2", Hash: PrefixHash(3)}, fault: "doubled"},
		"one twice, one lost":        {st: AppState{Count: 2, Last: "msg-2", Hash: h1}, fault: "doubled"},
		"a skipped redelivery":       {st: AppState{Count: 2, Last: "msg-2", Hash: h2, Skipped: 1}, fault: "doubled"},
		"someone else's message":     {st: AppState{Count: 1, Last: "hello", Hash: h1}, fault: "doubled"},
		"a count without a last one": {st: AppState{Count: 0, Last: "msg-1"}, fault: "doubled"},
	} {
		t.Run(name, func(t *testing.T) {
			err := CheckPrefix(tc.st)
			if (err == nil) != (tc.fault == "") || PrefixFault(err) != tc.fault {
				t.Fatalf("CheckPrefix = %v (%q), want %q", err, PrefixFault(err), tc.fault)
			}
			if err != nil && !errors.Is(err, ErrNotPrefix) {
				t.Errorf("%v does not wrap ErrNotPrefix", err)
			}
		})
	}
}
