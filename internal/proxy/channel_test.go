package proxy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSettle(t *testing.T) {
	for name, tc := range map[string]struct {
		tag         uint64
		multiple    bool
		wantCovered []uint64
		wantLeft    []uint64
	}{
		"single":                 {tag: 3, wantCovered: []uint64{3}, wantLeft: []uint64{1, 2, 5, 8}},
		"single unknown":         {tag: 4, wantLeft: []uint64{1, 2, 3, 5, 8}},
		"multiple up to a tag":   {tag: 5, multiple: true, wantCovered: []uint64{1, 2, 3, 5}, wantLeft: []uint64{8}},
		"multiple between tags":  {tag: 4, multiple: true, wantCovered: []uint64{1, 2, 3}, wantLeft: []uint64{5, 8}},
		"multiple zero is all":   {tag: 0, multiple: true, wantCovered: []uint64{1, 2, 3, 5, 8}},
		"multiple below all":     {tag: 0, multiple: false, wantLeft: []uint64{1, 2, 3, 5, 8}},
		"multiple past the last": {tag: 99, multiple: true, wantCovered: []uint64{1, 2, 3, 5, 8}},
	} {
		t.Run(name, func(t *testing.T) {
			ch := newChannel(1)
			for _, tag := range []uint64{1, 2, 3, 5, 8} {
				ch.outstanding = append(ch.outstanding, delivery{tag: tag, id: tag * 10})
			}
			covered := ch.settle(tc.tag, tc.multiple)
			if d := cmp.Diff(tc.wantCovered, tags(covered)); d != "" {
				t.Errorf("covered (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantLeft, tags(ch.outstanding)); d != "" {
				t.Errorf("left outstanding (-want +got):\n%s", d)
			}
		})
	}
}

func tags(ds []delivery) []uint64 {
	var out []uint64
	for _, d := range ds {
		out = append(out, d.tag)
	}
	return out
}
