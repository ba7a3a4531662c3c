package main

import "testing"

func TestSplit(t *testing.T) {
	for _, tc := range []struct{ n, deploy, sts, wantD, wantS int }{
		{30, 20, 10, 20, 10},
		{10, 20, 10, 7, 3},
		{2, 20, 10, 1, 1},
		{1, 20, 10, 1, 0},
		{5, 5, 0, 5, 0},
		{4, 0, 3, 0, 4},
	} {
		if d, s := split(tc.n, tc.deploy, tc.sts); d != tc.wantD || s != tc.wantS {
			t.Errorf("split(%d, %d, %d) = %d, %d; want %d, %d", tc.n, tc.deploy, tc.sts, d, s, tc.wantD, tc.wantS)
		}
	}
}
