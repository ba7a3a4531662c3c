package migrate

import (
	"strings"
	"testing"

	"github.com/ms2m/ms2m/internal/contract"
)

func TestPreflight(t *testing.T) {
	yes, no := true, false
	capable := func(node string) *contract.NodeCapabilities {
		return &contract.NodeCapabilities{Node: node, Runtime: "containerd", RuntimeVersion: "2.3.4", CRIUFound: &yes, CRIU: "4.1", CheckpointEnabled: &yes, RestoreEnabled: &yes, CgroupVersion: 2}
	}
	with := func(c *contract.NodeCapabilities, f func(*contract.NodeCapabilities)) *contract.NodeCapabilities {
		f(c)
		return c
	}
	tests := map[string]struct {
		src, dst     *contract.NodeCapabilities
		wantOK       bool
		wantInMsg    []string
		wantNotInMsg []string
	}{
		"both capable":                  {src: capable("a"), dst: capable("b"), wantOK: true},
		"older agents say nothing":      {wantOK: true},
		"unknown fields are no refusal": {src: &contract.NodeCapabilities{Node: "a"}, dst: &contract.NodeCapabilities{Node: "b"}, wantOK: true},
		"restore off on the target": {
			src: capable("a"),
			dst: with(capable("b"), func(c *contract.NodeCapabilities) {
				c.RestoreEnabled = &no
				c.Setting = `plugins."io.containerd.cri.v1.runtime".enable_experimental_restore_via_create = true`
				c.ConfigPath = "/etc/containerd/config.toml"
			}),
			wantInMsg: []string{"target node b", "enable_experimental_restore_via_create = true", "/etc/containerd/config.toml", "containerd 2.3.4"},
		},
		"containerd 2.4 on the target: no setting to change": {
			src: capable("a"),
			dst: with(capable("b"), func(c *contract.NodeCapabilities) {
				c.RuntimeVersion, c.RestoreEnabled, c.Notes = "2.4.0", &no, []string{"containerd 2.4 and later have no restore through CreateContainer"}
			}),
			wantInMsg:    []string{"target node b cannot restore", "containerd 2.4.0 cannot", "no restore through CreateContainer", "pick another target"},
			wantNotInMsg: []string{"set ", "restart the runtime"},
		},
		"containerd to CRI-O": {
			src:       capable("a"),
			dst:       with(capable("b"), func(c *contract.NodeCapabilities) { c.Runtime, c.RuntimeVersion = "cri-o", "1.34.0" }),
			wantInMsg: []string{"source node a runs containerd 2.3.4", "target node b runs cri-o 1.34.0", "pick a target that runs containerd"},
		},
		"CRI-O on both ends, other versions": {
			src:    with(capable("a"), func(c *contract.NodeCapabilities) { c.Runtime, c.RuntimeVersion = "cri-o", "1.34.0" }),
			dst:    with(capable("b"), func(c *contract.NodeCapabilities) { c.Runtime, c.RuntimeVersion = "cri-o", "1.34.2" }),
			wantOK: true,
		},
		"one runtime unknown is no refusal": {
			src:    capable("a"),
			dst:    with(capable("b"), func(c *contract.NodeCapabilities) { c.Runtime = "" }),
			wantOK: true,
		},
		"restore off on the source is no matter": {
			src: with(capable("a"), func(c *contract.NodeCapabilities) { c.RestoreEnabled = &no }),
			dst: capable("b"), wantOK: true,
		},
		"no CRIU on the source": {
			src:       with(capable("a"), func(c *contract.NodeCapabilities) { c.CRIUFound = &no }),
			dst:       capable("b"),
			wantInMsg: []string{"source node a has no CRIU", "checkpoint"},
		},
		"no CRIU on the target": {
			src:       capable("a"),
			dst:       with(capable("b"), func(c *contract.NodeCapabilities) { c.CRIUFound = &no }),
			wantInMsg: []string{"target node b has no CRIU", "restore"},
		},
		"checkpointing off on the source": {
			src: with(capable("a"), func(c *contract.NodeCapabilities) {
				c.Runtime, c.RuntimeVersion, c.CheckpointEnabled, c.Setting = "cri-o", "1.34.0", &no, "[crio.runtime] enable_criu_support = true"
			}),
			dst:       capable("b"),
			wantInMsg: []string{"source node a cannot checkpoint", "enable_criu_support = true", "cri-o 1.34.0"},
		},
		"the source's CRIU is checked before the target's restore": {
			src:          with(capable("a"), func(c *contract.NodeCapabilities) { c.CRIUFound = &no }),
			dst:          with(capable("b"), func(c *contract.NodeCapabilities) { c.RestoreEnabled = &no }),
			wantInMsg:    []string{"source node a"},
			wantNotInMsg: []string{"target node b"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			reason, msg, ok := Preflight(tc.src, tc.dst, contract.StrategyMS2M)
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v (message %q)", ok, tc.wantOK, msg)
			}
			if ok {
				if reason != "" || msg != "" {
					t.Errorf("ok with reason %q, message %q", reason, msg)
				}
				return
			}
			if reason != contract.ReasonMigrationNodeNotCapable {
				t.Errorf("reason = %q, want %q", reason, contract.ReasonMigrationNodeNotCapable)
			}
			for _, s := range tc.wantInMsg {
				if !strings.Contains(msg, s) {
					t.Errorf("message %q lacks %q", msg, s)
				}
			}
			for _, s := range tc.wantNotInMsg {
				if strings.Contains(msg, s) {
					t.Errorf("message %q has %q", msg, s)
				}
			}
		})
	}
}
