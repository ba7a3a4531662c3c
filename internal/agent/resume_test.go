package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// crioConf is the runtime part of a CRI-O node's crio.conf, as the e2e
// cluster writes it.
const crioConf = `[crio.runtime]
default_runtime = "runc"
enable_criu_support = true

[crio.runtime.runtimes.runc]
runtime_path = "/usr/sbin/runc"
runtime_root = "/var/tmp/node-1/crio/run/runc"
runtime_type = "oci"
monitor_path = "/usr/bin/conmon"
`

func TestCRIOResumer(t *testing.T) {
	tests := map[string]struct {
		texts []string
		want  Resumer
		err   string
	}{
		"the node's runc": {texts: []string{crioConf},
			want: OCIResumer{Path: "/usr/sbin/runc", Root: "/var/tmp/node-1/crio/run/runc"}},
		"a drop-in moves the root": {texts: []string{crioConf, "[crio.runtime.runtimes.runc]\nruntime_root = \"/run/elsewhere\"\n"},
			want: OCIResumer{Path: "/usr/sbin/runc", Root: "/run/elsewhere"}},
		"a drop-in picks another runtime": {texts: []string{crioConf, "[crio.runtime]\ndefault_runtime = \"crun\"\n[crio.runtime.runtimes.crun]\nruntime_root = \"/run/crun\"\n"},
			want: OCIResumer{Path: "crun", Root: "/run/crun"}},
		"a table without path or root leaves them to PATH and the runtime": {texts: []string{"[crio.runtime]\ndefault_runtime = \"runc\"\n[crio.runtime.runtimes.runc]\nruntime_type = \"oci\"\n"},
			want: OCIResumer{Path: "runc"}},
		"nothing said: CRI-O's built-in crun": {texts: []string{"[crio.runtime]\nenable_criu_support = true\n"},
			want: OCIResumer{Path: "crun", Root: "/run/crun"}},
		"a default runtime without its table": {texts: []string{"[crio.runtime]\ndefault_runtime = \"runc\"\n"},
			err: `default_runtime "runc" has no [crio.runtime.runtimes.runc] table`},
		"a VM runtime": {texts: []string{"[crio.runtime]\ndefault_runtime = \"kata\"\n[crio.runtime.runtimes.kata]\nruntime_type = \"vm\"\n"},
			err: `runtime_type "vm"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := CRIOResumer(tc.texts)
			checkResumer(t, got, err, tc.want, tc.err)
		})
	}
}

// checkResumer fails t unless got is want or, with wantErr, err says it.
func checkResumer(t *testing.T, got Resumer, err error, want Resumer, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("err = %v, want one that says %q", err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("resumer (-want +got):\n%s", diff)
	}
}

func TestOCIResumerArgs(t *testing.T) {
	id := strings.Repeat("ab", 32)
	if got, want := (OCIResumer{Path: "runc", Root: "/run/r"}).Args(id), []string{"--root", "/run/r", "resume", id}; !cmp.Equal(got, want) {
		t.Errorf("args = %q, want %q", got, want)
	}
	if got, want := (OCIResumer{Path: "runc"}).Args(id), []string{"resume", id}; !cmp.Equal(got, want) {
		t.Errorf("args without a root = %q, want %q", got, want)
	}
	for _, bad := range []string{"", "--help", "../x", "a b"} {
		if err := (OCIResumer{Path: "runc"}).Resume(t.Context(), bad); err == nil || !strings.Contains(err.Error(), "container ID") {
			t.Errorf("Resume(%q) = %v, want the ID refused", bad, err)
		}
	}
}

// TestOCIResumerRunsTheRuntime asks the host's runc to resume a container
// its (empty) root does not hold: the runtime runs, and its own answer is
// in the error.
func TestOCIResumerRunsTheRuntime(t *testing.T) {
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Fatalf("no runc on this host (the CRI-O nodes' runtime): %v", err)
	}
	err = OCIResumer{Path: runc, Root: filepath.Join(t.TempDir(), "runc")}.Resume(t.Context(), strings.Repeat("0", 64))
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("resume of a container runc does not have = %v, want runc's own \"does not exist\"", err)
	}
}

func TestResumerFor(t *testing.T) {
	containerdConf := "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\nenable_experimental_restore_via_create = true\n"
	tests := map[string]struct {
		runtime string
		texts   []string
		want    Resumer
		err     string
	}{
		"containerd": {runtime: "containerd", want: ContainerdResumer{Endpoint: "unix:///s"}},
		"cri-o":      {runtime: "cri-o", texts: []string{crioConf}, want: OCIResumer{Path: "/usr/sbin/runc", Root: "/var/tmp/node-1/crio/run/runc"}},
		"cri-o without its configuration": {runtime: "cri-o",
			err: "MS2M_AGENT_RUNTIME_CONFIG"},
		"no answer: CRI-O's configuration tells":      {texts: []string{crioConf}, want: OCIResumer{Path: "/usr/sbin/runc", Root: "/var/tmp/node-1/crio/run/runc"}},
		"no answer: containerd's configuration tells": {texts: []string{containerdConf}, want: ContainerdResumer{Endpoint: "unix:///s"}},
		"nothing tells":   {err: "not known"},
		"another runtime": {runtime: "docker", err: `runtime "docker"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := resumerFor(tc.runtime, "unix:///s", tc.texts)
			checkResumer(t, got, err, tc.want, tc.err)
		})
	}
}

// TestNodeResumerFromConfig: a runtime that does not answer at its socket
// is known by its configuration file, and what was found is kept.
func TestNodeResumerFromConfig(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "crio.conf")
	if err := os.WriteFile(conf, []byte(crioConf), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &NodeResumer{Endpoint: "unix://" + filepath.Join(dir, "no.sock"), Config: []string{conf, filepath.Join(dir, "absent-drop-in.conf")}}
	if err := r.Prepare(t.Context()); err != nil {
		t.Fatal(err)
	}
	got, err := r.runtime(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := OCIResumer{Path: "/usr/sbin/runc", Root: "/var/tmp/node-1/crio/run/runc"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("resumer (-want +got):\n%s", diff)
	}
	if err := os.WriteFile(conf, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if again, err := r.runtime(t.Context()); err != nil || !cmp.Equal(again, got) {
		t.Errorf("second lookup = %v, %v: want the first one kept", again, err)
	}
	// One that finds nothing keeps nothing: a later call asks again.
	none := &NodeResumer{Endpoint: r.Endpoint}
	if err := none.Prepare(t.Context()); err == nil {
		t.Fatal("Prepare found a runtime with neither an answer nor a configuration")
	}
	none.Config = []string{conf}
	if err := os.WriteFile(conf, []byte(crioConf), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := none.Prepare(t.Context()); err != nil {
		t.Errorf("Prepare after the configuration appeared: %v", err)
	}
}
