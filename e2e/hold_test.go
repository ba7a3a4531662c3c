package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
)

// TestHoldUntilFrozen migrates a consumer with a read-only root
// filesystem with ms2m at λ = 16 msg/s three times in one run: with the
// source holding deliveries for the kubelet's whole checkpoint call (as
// before), with the hold released as soon as the node sees the app
// frozen, and with that and the app thawed by the node's agent as soon as
// CRIU's dump is done (ThawAuto, which the read-only root allows), while
// containerd still archives. All end with the producer's hash and no
// skipped redelivery (migrateWhileProducing checks it): what the source
// hands its app after the freeze is not in the image and the target
// replays it. The second must have resumed at the freeze, the third also
// thawed at the dump; the gaps and holds are logged side by side.
// MS2M_E2E_HOLD_ROUNDS=n runs n triples.
func TestHoldUntilFrozen(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process, with the lab's host-side agent watching the app's cgroup")
	type result struct {
		name  string
		whole bool
		thaw  migrate.ThawPolicy
		rep   migrate.Report
		gap   time.Duration
	}
	// MS2M_E2E_HOLD_ROUNDS repeats the triple (default once).
	rounds, _ := strconv.Atoi(os.Getenv("MS2M_E2E_HOLD_ROUNDS"))
	var runs []*result
	for i := 1; i <= max(rounds, 1); i++ {
		runs = append(runs,
			&result{name: fmt.Sprintf("whole-call-%d", i), whole: true, thaw: migrate.ThawNever},
			&result{name: fmt.Sprintf("until-frozen-%d", i), thaw: migrate.ThawNever},
			&result{name: fmt.Sprintf("thaw-at-dump-%d", i), thaw: migrate.ThawAuto})
	}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			r.rep, r.gap = migrateWhileProducing(t, l, scenario{strategy: contract.StrategyMS2M, image: "consumer", n: 320, rate: 16, workMS: 20,
				holdWholeCall: r.whole, thaw: r.thaw, readOnlyRoot: true})
			h := r.rep.Hold
			if h == nil {
				t.Fatal("the report has no hold timings")
			}
			if r.thaw == migrate.ThawNever && h.ThawedAtDump {
				t.Error("the app was thawed at the dump although the plan says never")
			}
			if r.whole {
				if h.AtFreeze {
					t.Error("the source resumed at the freeze although the plan holds for the whole call")
				}
				return
			}
			if !h.AtFreeze {
				t.Fatalf("the source was not resumed at the freeze: %s", h.Fallback)
			}
			if h.Held >= h.Quiesce+h.Call {
				t.Errorf("the hold (%v) lasted past the checkpoint call (quiesce %v + call %v)", h.Held, h.Quiesce, h.Call)
			}
			if r.thaw == migrate.ThawAuto && !h.ThawedAtDump {
				// CRI-O's checkpoint call ends 10-30 ms after CRIU's dump
				// (containerd's 45-240 ms): a loaded node's agent may see the
				// call's end first, and then it rightly does not thaw. That is
				// a missed optimisation, not a wrong migration (the count and
				// hash are checked above); any other reason fails.
				if l.Cluster.Node(1).Runtime == cluster.RuntimeCRIO && strings.Contains(h.ThawFallback, "returned before the dump was seen") {
					t.Logf("CRI-O: the checkpoint call ended before the agent saw the dump's end, so it did not thaw (%s)", h.ThawFallback)
				} else {
					t.Errorf("the app (read-only root filesystem) was not thawed at the dump: %s", h.ThawFallback)
				}
			}
		})
	}
	for _, r := range runs {
		if h := r.rep.Hold; h != nil {
			t.Logf("%-14s processing gap %6v  switch %6v  held %6v (quiesce %v, to the freeze %v, dump %v (CRIU %v), after it %v, call %v; thawed at the dump %v)", r.name,
				r.gap.Round(time.Millisecond), r.rep.Downtime.Round(time.Millisecond), h.Held.Round(time.Millisecond),
				h.Quiesce.Round(time.Millisecond), h.ToFreeze.Round(time.Millisecond), h.Dump.Round(time.Millisecond), h.CRIU.Round(time.Millisecond), h.AfterDump.Round(time.Millisecond),
				h.Call.Round(time.Millisecond), h.ThawedAtDump)
		}
	}
}
