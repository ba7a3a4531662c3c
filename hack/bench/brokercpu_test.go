package main

import "testing"

func TestParseStat(t *testing.T) {
	for name, tc := range map[string]struct {
		line  string
		comm  string
		ticks uint64
		ok    bool
	}{
		"beam":                   {line: "2991 (beam.smp) S 2990 2989 2989 0 -1 4194560 1 0 0 0 1200 345 0 0 20 0 25 0", comm: "beam.smp", ticks: 1545, ok: true},
		"a name with ') ' in it": {line: "7 (a) b (c) R 1 1 1 0 -1 0 0 0 0 0 10 5 0 0", comm: "a) b (c", ticks: 15, ok: true},
		"cut short":              {line: "7 (x) R 1 1", ok: false},
		"no name":                {line: "garbage", ok: false},
	} {
		t.Run(name, func(t *testing.T) {
			comm, ticks, ok := parseStat([]byte(tc.line))
			if comm != tc.comm || ticks != tc.ticks || ok != tc.ok {
				t.Errorf("parseStat(%q) = %q, %d, %v; want %q, %d, %v", tc.line, comm, ticks, ok, tc.comm, tc.ticks, tc.ok)
			}
		})
	}
}
