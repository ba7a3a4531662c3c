package controller

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/internal/contract"
)

func TestDecide(t *testing.T) {
	running := Status{Name: "m1", Phase: contract.PhaseRunning, Source: "a", Target: "b"}
	for name, tc := range map[string]struct {
		s    situation
		want Action
	}{
		"no request":                                 {s: situation{node: "a"}, want: ActNone},
		"no request, a status":                       {s: situation{node: "b", hasStatus: true, status: Status{Phase: contract.PhaseSucceeded, Target: "b"}}, want: ActNone},
		"first request":                              {s: situation{node: "a", asked: true, migrateTo: "b"}, want: ActMigrate},
		"back after a success (A→B→A)":               {s: situation{node: "b", asked: true, migrateTo: "a", hasStatus: true, status: Status{Phase: contract.PhaseSucceeded, Source: "a", Target: "b"}}, want: ActMigrate},
		"corrected after a rejected typo":            {s: situation{node: "a", asked: true, migrateTo: "b", hasStatus: true, status: Status{Phase: contract.PhaseFailed, Target: "no-such-node"}}, want: ActMigrate},
		"same target after a failure":                {s: situation{node: "a", asked: true, migrateTo: "b", hasStatus: true, status: Status{Phase: contract.PhaseFailed, Target: "b"}}, want: ActMigrate},
		"again after a rollback":                     {s: situation{node: "a", asked: true, migrateTo: "b", hasStatus: true, status: Status{Phase: contract.PhaseRolledBack, Target: "b"}}, want: ActMigrate},
		"same node":                                  {s: situation{node: "a", asked: true, migrateTo: "a"}, want: ActSameNode},
		"same node after a success":                  {s: situation{node: "b", asked: true, migrateTo: "b", hasStatus: true, status: Status{Phase: contract.PhaseSucceeded, Target: "b"}}, want: ActSameNode},
		"empty target is checked later":              {s: situation{node: "a", asked: true, migrateTo: ""}, want: ActMigrate},
		"ours, under way":                            {s: situation{node: "a", asked: true, migrateTo: "b", hasStatus: true, status: running, ours: true}, want: ActWait},
		"another target while ours runs":             {s: situation{node: "a", asked: true, migrateTo: "c", hasStatus: true, status: running, ours: true}, want: ActBusy},
		"back to its node while ours runs":           {s: situation{node: "a", asked: true, migrateTo: "a", hasStatus: true, status: running, ours: true}, want: ActBusy},
		"running, no one drives it":                  {s: situation{node: "a", asked: true, migrateTo: "b", hasStatus: true, status: running}, want: ActRollBack},
		"running, no one drives it, changed request": {s: situation{node: "a", asked: true, migrateTo: "c", hasStatus: true, status: running}, want: ActRollBack},
		"the target of ours":                         {s: situation{node: "b", asked: true, migrateTo: "a", targetOfOurs: true}, want: ActBusy},
		"the target of ours, same node":              {s: situation{node: "b", asked: true, migrateTo: "b", targetOfOurs: true}, want: ActBusy},
		"unreadable status":                          {s: situation{node: "a", asked: true, migrateTo: "b", hasStatus: true, statusBad: true}, want: ActBadStatus},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, decide(tc.s)); diff != "" {
				t.Errorf("decide(%+v) (-want +got):\n%s", tc.s, diff)
			}
		})
	}
}

func TestEndedKeepsAShortHistory(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var st Status
	nodes := []string{"a", "b"}
	for i := range 8 {
		st = Status{Name: "m" + string(rune('0'+i)), Phase: contract.PhaseSucceeded, Source: nodes[i%2], Target: nodes[(i+1)%2], Started: t0.Add(time.Duration(i) * time.Minute), History: st.History}
		st = st.ended()
	}
	var got []string
	for _, e := range st.History {
		got = append(got, e.Name+" "+e.From+"→"+e.To)
	}
	want := []string{"m7 b→a", "m6 a→b", "m5 b→a", "m4 a→b", "m3 b→a"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("history (-want +got):\n%s", diff)
	}
	// Written again (a retried write), the entry is not doubled.
	if again := st.ended(); len(again.History) != HistoryLen || again.History[1].Name != "m6" {
		t.Errorf("written again: %+v", again.History)
	}
	// A running status is not in its own history.
	if r := (Status{Name: "m8", Phase: contract.PhaseRunning, History: st.History}).ended(); r.History[0].Name != "m7" {
		t.Errorf("a running status entered its history: %+v", r.History[0])
	}
}
