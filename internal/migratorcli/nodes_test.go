package migratorcli

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/internal/contract"
)

func TestNodeCells(t *testing.T) {
	yes, no := true, false
	tests := map[string]struct {
		row  nodeRow
		want []string
	}{
		"capable": {
			row:  nodeRow{Node: "a", Caps: &contract.NodeCapabilities{Runtime: "containerd", RuntimeVersion: "2.3.4", CRIUFound: &yes, CRIU: "4.1", CheckpointEnabled: &yes, RestoreEnabled: &yes, CgroupVersion: 2}},
			want: []string{"a", "containerd 2.3.4", "4.1", "yes", "yes", "v2", "-"},
		},
		"restore off names the setting": {
			row:  nodeRow{Node: "b", Caps: &contract.NodeCapabilities{Runtime: "cri-o", RuntimeVersion: "1.34.0", CRIUFound: &no, CheckpointEnabled: &yes, RestoreEnabled: &no, Setting: `[crio.checkpoint_restore] container_level_enabled = "checkpoint_restore"`, CgroupVersion: 1}},
			want: []string{"b", "cri-o 1.34.0", "missing", "yes", "no", "v1", `set [crio.checkpoint_restore] container_level_enabled = "checkpoint_restore"`},
		},
		"nothing known": {
			row:  nodeRow{Node: "c", Caps: &contract.NodeCapabilities{Notes: []string{"no runtime\nanswered"}}},
			want: []string{"c", "-", "?", "?", "?", "?", "no runtime answered"},
		},
		"older agent": {
			row:  nodeRow{Node: "d", Error: "the agent on node d: 404 Not Found"},
			want: []string{"d", "?", "?", "?", "?", "?", "agent did not answer (an older agent?): the agent on node d: 404 Not Found"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, nodeCells(tc.row)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
	var b strings.Builder
	if err := writeNodes(&b, []nodeRow{tests["capable"].row}); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(b.String()), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "NODE") {
		t.Errorf("table %q: want a header and one row", b.String())
	}
}
