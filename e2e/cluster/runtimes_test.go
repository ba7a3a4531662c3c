package cluster

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNodeRuntimes(t *testing.T) {
	for name, tc := range map[string]struct {
		spec     string
		nodes    int
		want     []string
		wantSpec string
		wantErr  bool
	}{
		"one for all":        {spec: "crio", nodes: 3, want: []string{"crio", "crio", "crio"}, wantSpec: "crio"},
		"one per node":       {spec: "containerd,crio", nodes: 2, want: []string{"containerd", "crio"}, wantSpec: "containerd,crio"},
		"spaces":             {spec: "crio, crio ,containerd", nodes: 3, want: []string{"crio", "crio", "containerd"}, wantSpec: "crio,crio,containerd"},
		"a list of the same": {spec: "crio,crio", nodes: 2, want: []string{"crio", "crio"}, wantSpec: "crio"},
		"too few":            {spec: "containerd,crio", nodes: 3, wantErr: true},
		"too many":           {spec: "containerd,crio,crio", nodes: 2, wantErr: true},
		"unknown":            {spec: "containerd,docker", nodes: 2, wantErr: true},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := nodeRuntimes(tc.spec, tc.nodes)
			if (err != nil) != tc.wantErr {
				t.Fatalf("nodeRuntimes(%q, %d) error %v, want error %v", tc.spec, tc.nodes, err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("nodeRuntimes(%q, %d) (-want +got):\n%s", tc.spec, tc.nodes, diff)
			}
			if s := runtimeSpec(got); s != tc.wantSpec {
				t.Errorf("runtimeSpec(%q) = %q, want %q", got, s, tc.wantSpec)
			}
			if o := (Options{Nodes: tc.nodes, Runtime: tc.spec}).withDefaults(); o.Runtime != tc.wantSpec {
				t.Errorf("withDefaults: Runtime %q, want %q", o.Runtime, tc.wantSpec)
			}
		})
	}
}

// TestRecordRuntimes: records from before mixed clusters (no runtime, or
// one for all nodes) and a mixed one give each node its runtime.
func TestRecordRuntimes(t *testing.T) {
	for name, tc := range map[string]struct {
		json string
		want []string // nodes 1 to 3
	}{
		"before runtimes": {json: `{"nodes":2,"binDir":"/b"}`, want: []string{"containerd", "containerd", "containerd"}},
		"one runtime":     {json: `{"nodes":2,"binDir":"/b","runtime":"crio"}`, want: []string{"crio", "crio", "crio"}},
		"mixed":           {json: `{"nodes":2,"binDir":"/b","runtime":"crio,containerd","nodeRuntimes":["crio","containerd"]}`, want: []string{"crio", "containerd", "containerd"}},
	} {
		t.Run(name, func(t *testing.T) {
			var rec record
			if err := json.Unmarshal([]byte(tc.json), &rec); err != nil {
				t.Fatal(err)
			}
			got := []string{rec.runtimeOf(1), rec.runtimeOf(2), rec.runtimeOf(3)}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("runtimeOf 1..3 (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want[:2], rec.runtimes()); diff != "" {
				t.Errorf("runtimes (-want +got):\n%s", diff)
			}
		})
	}
}
