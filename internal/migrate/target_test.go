package migrate

import "testing"

// TestRestoreAtStop: a restore to a stop's cutoff names the cutoff ID and
// the stop's epoch; a stop at ID 0 cannot be named (0 reads as "marker"),
// so the target learns it from that stop's marker, the first of an epoch
// above the one before it (TestStopAndCopyNeverFedConsumer in
// internal/sidecar runs that range).
func TestRestoreAtStop(t *testing.T) {
	for _, tc := range []struct {
		cutoff, epoch      uint64
		wantCut, wantEpoch string
	}{
		{cutoff: 42, epoch: 3, wantCut: "42", wantEpoch: "3"},
		{cutoff: 0, epoch: 1, wantCut: "marker", wantEpoch: "0"},
		{cutoff: 0, epoch: 5, wantCut: "marker", wantEpoch: "4"},
	} {
		m := Restore{Start: tc.cutoff}.atStop(tc.cutoff, tc.epoch).instruction()
		if m.ReplayCutoff != tc.wantCut || m.ReplayEpoch != tc.wantEpoch {
			t.Errorf("atStop(%d, %d): cutoff %q epoch %q, want %q %q", tc.cutoff, tc.epoch, m.ReplayCutoff, m.ReplayEpoch, tc.wantCut, tc.wantEpoch)
		}
	}
}
