package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestSplitRestore splits a restore by containerd's log lines as node 2
// wrote them in a real run (shortened IDs), and gives nothing when a line
// is missing.
func TestSplitRestore(t *testing.T) {
	const img = "10.77.0.1:5000/ms2m/checkpoints/default@sha256:d04d"
	log := `time="2026-12-05T16:37:10.000000000Z" level=info msg="RunPodSandbox for name:\"other\"  uid:\"1\"  namespace:\"default\""
time="2026-12-05T16:37:11.280000000Z" level=info msg="RunPodSandbox for name:\"t\"  uid:\"3\"  namespace:\"default\""
time="2026-12-05T16:37:11.380000000Z" level=info msg="RunPodSandbox for name:\"t\"  uid:\"3\"  namespace:\"default\" returns sandbox id \"844a\""
time="2026-12-05T16:37:11.385000000Z" level=info msg="PullImage \"10.77.0.1:5000/ms2m/sidecar:lab\""
time="2026-12-05T16:37:11.550000000Z" level=info msg="StartContainer for \"fb91\""
time="2026-12-05T16:37:11.620000000Z" level=info msg="StartContainer for \"fb91\" returns successfully"
time="2026-12-05T16:37:12.460000000Z" level=info msg="PullImage \"` + img + `\""
time="2026-12-05T16:37:12.540000000Z" level=info msg="PullImage \"` + img + `\" returns image reference \"sha256:5fa2\""
time="2026-12-05T16:37:12.542000000Z" level=info msg="CreateContainer within sandbox \"844a\" for container name:\"app\""
time="2026-12-05T16:37:12.580000000Z" level=info msg="CreateContainer within sandbox \"844a\" for name:\"app\" returns container id \"dc37\""
time="2026-12-05T16:37:12.720000000Z" level=info msg="StartContainer for \"dc37\" returns successfully"
`
	began := time.Date(2026, 12, 5, 16, 37, 10, 800_000_000, time.UTC)
	ended := began.Add(2 * time.Second)
	want := &targetSteps{ToSandboxMs: 480, SandboxMs: 100, SidecarMs: 240, ProbesMs: 840, PullMs: 80, CreateMs: 40, StartMs: 140, ReadyMs: 80}
	got := splitRestore(log, "t", img, began, ended)
	round := func(s *targetSteps) {
		for _, v := range []*float64{&s.ToSandboxMs, &s.SandboxMs, &s.SidecarMs, &s.ProbesMs, &s.PullMs, &s.CreateMs, &s.StartMs, &s.ReadyMs} {
			*v = float64(int(*v + 0.5))
		}
	}
	if got == nil {
		t.Fatal("splitRestore = nil, want the steps")
	}
	round(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("splitRestore (-want +got):\n%s", diff)
	}
	if got := splitRestore(log, "t", "another@sha256:1", began, ended); got != nil {
		t.Errorf("another image: splitRestore = %+v, want nil", got)
	}
	if got := splitRestore(log, "t", img, began, began.Add(time.Second)); got != nil {
		t.Errorf("seen ready before the app started: splitRestore = %+v, want nil", got)
	}
}
