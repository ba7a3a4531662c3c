package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/internal/testenv"
)

func TestParseTOMLish(t *testing.T) {
	tests := map[string]struct {
		text string
		want map[string]string
	}{
		"containerd v3": {
			text: "version = 3\n[plugins]\n  [plugins.'io.containerd.cri.v1.runtime']\n    enable_experimental_restore_via_create = true # needed for ms2m\n    cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']\n",
			want: map[string]string{"version": "3", "plugins.io.containerd.cri.v1.runtime.enable_experimental_restore_via_create": "true"},
		},
		"containerd v2 with double quotes": {
			text: "[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_experimental_restore_via_create = false\n",
			want: map[string]string{"plugins.io.containerd.grpc.v1.cri.enable_experimental_restore_via_create": "false"},
		},
		"crio strings and comments": {
			text: "# enable_criu_support = false\n[crio.runtime]\nenable_criu_support = true\n[crio.checkpoint_restore]\ncontainer_level_enabled = \"checkpoint_only\" # default\n",
			want: map[string]string{"crio.runtime.enable_criu_support": "true", "crio.checkpoint_restore.container_level_enabled": "checkpoint_only"},
		},
		"broken lines are skipped": {
			text: "[unclosed\nkey\n= novalue\nx = \"unterminated\n",
			want: map[string]string{},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ParseTOMLish(tc.text)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestRuntimeSettings(t *testing.T) {
	yes, no := true, false
	tests := map[string]struct {
		runtime, version string
		texts            []string
		wantCheckpoint   *bool
		wantRestore      *bool
		wantSetting      string
		wantNote         bool
	}{
		"containerd 2.2.9, unset: off by default": {runtime: "containerd", version: "v2.2.9", wantCheckpoint: &yes, wantRestore: &no, wantSetting: containerdRestoreSetting},
		"containerd 2.2.6, unset: on by default":  {runtime: "containerd", version: "2.2.6", wantCheckpoint: &yes, wantRestore: &yes, wantSetting: containerdRestoreSetting},
		"containerd 2.3.3, unset: on by default":  {runtime: "containerd", version: "2.3.3", wantCheckpoint: &yes, wantRestore: &yes, wantSetting: containerdRestoreSetting},
		"containerd 2.3.4, unset: off by default": {runtime: "containerd", version: "2.3.4", wantCheckpoint: &yes, wantRestore: &no, wantSetting: containerdRestoreSetting},
		"containerd 2.4.0: gone":                  {runtime: "containerd", version: "2.4.0", wantCheckpoint: &yes, wantRestore: &no, wantNote: true},
		"containerd 1.7.20: on":                   {runtime: "containerd", version: "1.7.20", wantCheckpoint: &yes, wantRestore: &yes, wantSetting: containerdRestoreSetting},
		"containerd unknown version, unset":       {runtime: "containerd", version: "main", wantCheckpoint: &yes, wantSetting: containerdRestoreSetting, wantNote: true},
		"containerd 2.3.4, set true": {
			runtime: "containerd", version: "2.3.4",
			texts:          []string{"[plugins.'io.containerd.cri.v1.runtime']\nenable_experimental_restore_via_create = true\n"},
			wantCheckpoint: &yes, wantRestore: &yes, wantSetting: containerdRestoreSetting,
		},
		"containerd 2.3.7 (the local cluster's), unset: off by default": {runtime: "containerd", version: "v2.3.7", wantCheckpoint: &yes, wantRestore: &no, wantSetting: containerdRestoreSetting},
		"containerd 2.3.7, set true in a version 4 config": {
			runtime: "containerd", version: "v2.3.7",
			texts:          []string{"version = 4\n[plugins]\n  [plugins.'io.containerd.cri.v1.runtime']\n    enable_criu = true\n    enable_experimental_restore_via_create = true\n"},
			wantCheckpoint: &yes, wantRestore: &yes, wantSetting: containerdRestoreSetting,
		},
		"containerd 2.2.6, set false in a v2 config": {
			runtime: "containerd", version: "2.2.6",
			texts:          []string{"[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_experimental_restore_via_create = false\n"},
			wantCheckpoint: &yes, wantRestore: &no, wantSetting: containerdRestoreSetting,
		},
		"containerd 2.4, set true: gone anyway": {
			runtime: "containerd", version: "2.4.0",
			texts:          []string{"[plugins.'io.containerd.cri.v1.runtime']\nenable_experimental_restore_via_create = true\n"},
			wantCheckpoint: &yes, wantRestore: &no, wantNote: true,
		},
		"cri-o without criu support": {
			runtime: "cri-o", version: "1.34.0",
			texts:          []string{"[crio.runtime]\nenable_criu_support = false\n"},
			wantCheckpoint: &no, wantRestore: &no, wantSetting: crioCRIUSetting,
		},
		"cri-o checkpoint_only": {
			runtime: "cri-o", version: "1.34.0",
			texts:          []string{"[crio.runtime]\nenable_criu_support = true\n", "[crio.checkpoint_restore]\ncontainer_level_enabled = \"checkpoint_only\"\n"},
			wantCheckpoint: &yes, wantRestore: &no, wantSetting: crioRestoreSetting,
		},
		"cri-o restore on, a drop-in wins": {
			runtime: "cri-o", version: "1.34.0",
			texts:          []string{"[crio.runtime]\nenable_criu_support = true\n[crio.checkpoint_restore]\ncontainer_level_enabled = \"checkpoint_only\"\n", "[crio.checkpoint_restore]\ncontainer_level_enabled = \"checkpoint_restore\"\n"},
			wantCheckpoint: &yes, wantRestore: &yes, wantSetting: crioRestoreSetting,
		},
		"cri-o none": {
			runtime: "cri-o", version: "1.34.0",
			texts:          []string{"[crio.checkpoint_restore]\ncontainer_level_enabled = \"none\"\n"},
			wantCheckpoint: &no, wantRestore: &no, wantSetting: crioRestoreSetting,
		},
		"cri-o, a value it does not take: unknown": {
			runtime: "cri-o", version: "1.34.0",
			texts:       []string{"[crio.checkpoint_restore]\ncontainer_level_enabled = \"true\"\n"},
			wantSetting: crioRestoreSetting, wantNote: true,
		},
		"cri-o says nothing: unknown": {runtime: "cri-o", version: "1.34.0", wantSetting: crioCRIUSetting},
		"unknown runtime":             {runtime: "sim", wantNote: true},
		"no runtime":                  {wantNote: true},
		"no runtime, a CRI-O config tells": {
			texts:          []string{"[crio.runtime]\nenable_criu_support = false\n"},
			wantCheckpoint: &no, wantRestore: &no, wantSetting: crioCRIUSetting,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := RuntimeSettings(tc.runtime, tc.version, tc.texts)
			if diff := cmp.Diff(tc.wantCheckpoint, got.Checkpoint); diff != "" {
				t.Errorf("checkpoint (-want +got)\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantRestore, got.Restore); diff != "" {
				t.Errorf("restore (-want +got)\n%s", diff)
			}
			if got.Setting != tc.wantSetting {
				t.Errorf("setting = %q, want %q", got.Setting, tc.wantSetting)
			}
			if (got.Note != "") != tc.wantNote {
				t.Errorf("note = %q, want one: %v", got.Note, tc.wantNote)
			}
		})
	}
}

func TestParseCRIUVersion(t *testing.T) {
	tests := map[string]struct{ out, want string }{
		"release":  {out: "Version: 4.1\n", want: "4.1"},
		"with git": {out: "Version: 3.19\nGitID: v3.19-12-gabcdef\n", want: "3.19"},
		"garbage":  {out: "criu: command not found\n", want: ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := ParseCRIUVersion(tc.out); got != tc.want {
				t.Errorf("ParseCRIUVersion(%q) = %q, want %q", tc.out, got, tc.want)
			}
		})
	}
}

func TestCgroupVersion(t *testing.T) {
	v2, v1, none := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(v2, "cgroup.controllers"), []byte("cpu memory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(v1, "freezer"), 0o755); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]int{v2: 2, v1: 1, none: 0} {
		if got := cgroupVersion(dir); got != want {
			t.Errorf("cgroupVersion(%s) = %d, want %d", dir, got, want)
		}
	}
}

// TestNodeEndpoint serves a probe of a node whose containerd config turns
// restore off and whose CRIU is missing, and reads it through the Client;
// an agent without a probe (as an older agent) is an error for the client.
func TestNodeEndpoint(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(conf, []byte("version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_experimental_restore_via_create = false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	probe := NodeProbe{RuntimeConfig: []string{conf}, CRIUPath: filepath.Join(dir, "criu"), CgroupRoot: dir}
	c, _, _, _ := setup(t, func(cfg *Config) { cfg.Node = probe })
	got, err := c.NodeCapabilities(t.Context(), "node-1")
	if err != nil {
		t.Fatal(err)
	}
	no := false
	if got.Node != "node-1" || got.Runtime != "" || got.CRIUFound == nil || *got.CRIUFound || got.RestoreEnabled == nil || *got.RestoreEnabled != no ||
		got.Setting != containerdRestoreSetting || got.ConfigPath != conf {
		t.Errorf("capabilities = %+v, want node n1, no CRIU, restore off by %s in %s", got, containerdRestoreSetting, conf)
	}

	old, _, _, _ := setup(t)
	if _, err := old.NodeCapabilities(t.Context(), "node-1"); err == nil {
		t.Error("an agent without a probe answered capabilities")
	}
}

// TestProbeRealCRIU runs the probe against the CRIU the local cluster's
// nodes use (bin/criu/criu, `make criu`): found, with its version.
func TestProbeRealCRIU(t *testing.T) {
	criu := filepath.Join(testenv.ModuleRoot(t), "bin", "criu", "criu")
	if _, err := os.Stat(criu); err != nil {
		testenv.Missing(t, "CRIU at "+criu, "make criu")
	}
	got := NodeProbe{CRIUPath: criu, CgroupRoot: "/sys/fs/cgroup"}.Probe(t.Context())
	if got.CRIUFound == nil || !*got.CRIUFound || got.CRIU == "" {
		t.Errorf("probe of %s: found %v, version %q, notes %q; want found with a version", criu, got.CRIUFound, got.CRIU, got.Notes)
	}
	if got.CgroupVersion == 0 {
		t.Errorf("probe: no cgroup version under /sys/fs/cgroup (notes %q)", got.Notes)
	}
	t.Logf("CRIU %s, cgroup v%d", got.CRIU, got.CgroupVersion)
}
