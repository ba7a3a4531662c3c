package agent

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/testenv"
)

// recordingRuntime stands for the node's runtime in these unit tests of the
// agent's own logic: it locates the one container of fakeNode and
// resumes it by thawing its freezer. The e2e suite's
// TestNodeAgentKilledOnRealNodes holds the behaviour on real containerd.
type recordingRuntime struct {
	mu      sync.Mutex
	thaw    func()
	refuse  bool // answer as containerd does for a task it holds running
	resumed []string
	located []string // ns/pod/container asked for
}

func (f *recordingRuntime) Locate(_ context.Context, ns, pod, container string) ([]Located, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.located = append(f.located, ns+"/"+pod+"/"+container)
	return []Located{{PodUID: testPod, ID: testCtr}}, nil
}

func (f *recordingRuntime) Resume(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse {
		return errors.New("cannot resume a running process")
	}
	f.resumed = append(f.resumed, id)
	f.thaw()
	return nil
}

func (f *recordingRuntime) got() (located, resumed []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.located), slices.Clone(f.resumed)
}

// TestUnpauseAfterAFailedCheckpoint: the kubelet's checkpoint fails with
// the app's cgroup left frozen (as containerd leaves it when the call is
// cancelled); the agent resumes it through the runtime. A container that
// is not frozen, or that CRIU holds by ptrace, is left alone.
func TestUnpauseAfterAFailedCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		freezer string
		tasks   []string
		refuse  bool
		later   func(set func(string, ...string)) // what the node does meanwhile
		want    string                            // the freezer.state at the end
		resumed bool                              // through the runtime
	}{
		{name: "left frozen by the runtime", freezer: "FROZEN", tasks: []string{"S (sleeping)", "S (sleeping)"}, want: "THAWED", resumed: true},
		{name: "left frozen by a CRIU that died", freezer: "FROZEN", tasks: []string{"S (sleeping)"}, refuse: true, want: "THAWED"},
		{name: "frozen while CRIU dumps, then CRIU dies", freezer: "FROZEN", tasks: []string{"t (tracing stop)"}, refuse: true, want: "THAWED",
			later: func(set func(string, ...string)) { time.Sleep(300 * time.Millisecond); set("FROZEN", "S (sleeping)") }},
		{name: "running", freezer: "THAWED", tasks: []string{"S (sleeping)", "R (running)"}, want: "THAWED"},
		{name: "held by CRIU, not frozen", freezer: "THAWED", tasks: []string{"t (tracing stop)", "t (tracing stop)"}, want: "THAWED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, dir, set := fakeNode(t)
			set(tc.freezer, tc.tasks...)
			rt := &recordingRuntime{refuse: tc.refuse, thaw: func() { set("THAWED", tc.tasks...) }}
			w.Runtime = rt
			c := failingAgent(t, w, rt)
			if tc.later != nil {
				go tc.later(set)
			}
			if _, err := c.Checkpoint(t.Context(), "node-1", "shop", "app-0", "app", time.Minute); err == nil {
				t.Fatal("the checkpoint succeeded; the kubelet failed it")
			}
			testenv.Eventually(t, 10*time.Second, "the container thawed", func() bool {
				located, _ := rt.got()
				b, _ := os.ReadFile(filepath.Join(dir, "freezer.state"))
				return len(located) == 1 && strings.TrimSpace(string(b)) == tc.want
			})
			located, resumed := rt.got()
			if !slices.Equal(located, []string{"shop/app-0/app"}) {
				t.Errorf("located %q, want the checkpointed container", located)
			}
			if got := len(resumed) == 1 && resumed[0] == testCtr; got != tc.resumed {
				t.Errorf("resumed through the runtime: %q; want a resume: %v", resumed, tc.resumed)
			}
		})
	}
}

// failingAgent serves an agent whose kubelet fails every checkpoint, on
// the fake node w, with rt as its runtime.
func failingAgent(t *testing.T, w FreezeWatch, rt *recordingRuntime) Client {
	t.Helper()
	k := &fakeKubelet{fail: "checkpointing container failed: context canceled"}
	ks := httptest.NewTLSServer(k)
	t.Cleanup(ks.Close)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("sa-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(Config{CheckpointDir: t.TempDir(), Token: "tok", NodeName: "node-1", Freeze: w, Locator: rt,
		Kubelet: &Kubelet{URL: ks.URL, TokenFile: tokFile, HTTP: ks.Client()}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return Client{Token: "tok", Resolve: func(context.Context, string) (string, error) { return srv.URL, nil }}
}

// TestUnpauseWhatAPreviousAgentLeft: an agent died while the kubelet
// checkpointed (its journal entry has no answer); the next agent's first
// sweep resumes the container it finds frozen, and only that one: an
// answered entry and one of this process are not touched.
func TestUnpauseWhatAPreviousAgentLeft(t *testing.T) {
	w, _, set := fakeNode(t)
	set("FROZEN", "S (sleeping)")
	rt := &recordingRuntime{thaw: func() { set("THAWED", "S (sleeping)") }}
	w.Runtime = rt
	dir := t.TempDir()
	journal := filepath.Join(dir, journalDir)
	if err := os.MkdirAll(journal, 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Minute).UnixNano()
	for name, archive := range map[string]string{
		"shop_app-0_app_" + strconv.FormatInt(old, 10):   "",
		"shop_app-1_app_" + strconv.FormatInt(old+1, 10): filepath.Join(dir, "checkpoint-app-1_shop-app-x.tar"),
		"shop_app-2_app_" + strconv.FormatInt(old*2, 10): "", // from the future: this process's
	} {
		if err := os.WriteFile(filepath.Join(journal, name), []byte(archive), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewServer(Config{CheckpointDir: dir, Token: "tok", Freeze: w, Locator: rt})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.SweepArchives(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, resumed := rt.got(); len(resumed) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	located, resumed := rt.got()
	if !slices.Equal(located, []string{"shop/app-0/app"}) {
		t.Errorf("located %q, want only the unanswered entry of the previous agent", located)
	}
	if !slices.Equal(resumed, []string{testCtr}) {
		t.Errorf("resumed %q, want the frozen container once", resumed)
	}
}
