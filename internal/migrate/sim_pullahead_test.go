package migrate_test

import (
	"testing"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
)

// TestPullAheadOnSimulatedNodes: with Plan.PullAhead the target node's
// agent pulls the checkpoint image once the target pod is created (a
// second pull on node B, after the base image's), the migration stays
// exact, and the report says how long the pull took.
func TestPullAheadOnSimulatedNodes(t *testing.T) {
	c := cluster(t)
	const ns = "sim-pull-ahead"
	resetNodes(c)
	w := deploy(t, c, ns, "Deployment", true)
	t.Cleanup(func() { removeWorkload(t, c, w) }) // its addresses go back to the suite's 60
	p := plan(w, contract.StrategyMS2M)
	p.PullAhead = true
	rep, err := migrate.Run(t.Context(), env(c, c.Client), p)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	final := checkServing(t, c, w, rep)
	checkPods(t, c, w, rep, final)
	if rep.Parts == nil || rep.Parts.PulledAhead <= 0 || rep.Parts.PullAheadFailed != "" {
		t.Errorf("Report.Parts = %+v, want the agent's pull ahead timed and not failed", rep.Parts)
	}
	// The pulls are counted, not listed: the one ahead runs beside the
	// migrator's polls of the target, in no fixed order with them.
	pulls := 0
	for _, call := range c.Nodes[nodeB].Calls() {
		if call == "agent POST /v1/pulls" {
			pulls++
		}
	}
	if pulls != 2 {
		t.Errorf("node %s: %d agent pulls, want 2 (the app's base image, then its checkpoint image ahead): %q", nodeB, pulls, c.Nodes[nodeB].Calls())
	}
}
