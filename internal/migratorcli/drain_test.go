package migratorcli

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDrainTableAndSummary(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	rows := []drainRow{
		{Pod: "shop/consumer-0", Strategy: "statefulset-shadow", Phase: "Running", Started: t0},
		{Pod: "shop/api-1", Phase: "evicted", Started: t0, Ended: t0.Add(1500 * time.Millisecond), Outcome: drainEvicted},
		{Pod: "shop/consumer-7f-x", Strategy: "ms2m", Phase: "Succeeded", Started: t0, Ended: t0.Add(4 * time.Second), Downtime: 12 * time.Millisecond, Outcome: drainMigrated},
		{Pod: "shop/consumer-7f-y", Strategy: "ms2m", Phase: "failed", Started: t0, Ended: t0.Add(3 * time.Second), Outcome: drainFailed, Message: "restore: no CRIU"},
	}
	want := `POD                 STRATEGY            PHASE      ELAPSED  DOWNTIME
shop/api-1          -                   evicted    1.5s     -
shop/consumer-0     statefulset-shadow  Running    5s       -
shop/consumer-7f-x  ms2m                Succeeded  4s       12ms
shop/consumer-7f-y  ms2m                failed     3s       -
`
	if diff := cmp.Diff(want, drainTable(rows, t0.Add(5*time.Second))); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
	rows[0].Outcome, rows[0].Ended = drainTimeout, t0.Add(6*time.Second)
	wantSum := `drain node-1: 4 pods in 6s: 1 migrated, 1 evicted, 1 failed, 1 timed out, 0 errors
not moved (the node is still cordoned):
  shop/consumer-0: timeout: -
  shop/consumer-7f-y: failed: restore: no CRIU
`
	if diff := cmp.Diff(wantSum, drainSummary("node-1", rows)); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
}
