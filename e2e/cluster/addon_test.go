package cluster

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAddons starts a real process as an addon of a cluster record (no
// cluster runs: the addon is a sleep on the host), and checks that status
// lists it, that starting it again replaces it, and that what Down does
// first stops it and forgets it.
func TestAddons(t *testing.T) {
	l := layout{dir: t.TempDir()}
	for _, d := range []string{"run", "logs"} {
		if err := os.MkdirAll(l.path(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(l.record(), []byte(`{"nodes":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{l: l, nodes: 1}
	sleeper := Addon{Name: "sleeper", Bin: "/bin/sleep", Args: []string{"60"}, Env: []string{"MS2M_ADDON_TEST=1"}}
	pid, log, err := c.StartAddon(sleeper)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopAddons(l) })
	if got, ok := c.AddonRunning("sleeper"); !ok || got != pid {
		t.Fatalf("AddonRunning = %d, %t; want %d, true", got, ok, pid)
	}
	if env, err := environ(pid); err != nil || !strings.Contains(env, "MS2M_ADDON_TEST=1") {
		t.Errorf("the addon's environment lacks its Env (%q, %v)", env, err)
	}
	if log != c.AddonLog("sleeper") {
		t.Errorf("log %s, AddonLog %s", log, c.AddonLog("sleeper"))
	}

	again, _, err := c.StartAddon(sleeper)
	if err != nil {
		t.Fatal(err)
	}
	if again == pid || pidRuns(pid, "/bin/sleep") {
		t.Errorf("starting the addon again left pid %d running beside %d", pid, again)
	}

	st, err := GetStatus(t.Context(), Options{StateDir: l.dir})
	if err != nil && !strings.Contains(err.Error(), "kubeconfig") {
		t.Fatal(err)
	}
	found := false
	for _, comp := range st.Components {
		if name, ok := AddonName(comp.Name); ok && name == "sleeper" {
			found = comp.Running && comp.PID == again
		}
	}
	if !found {
		t.Errorf("status does not list the running addon: %+v", st.Components)
	}

	if _, _, err := c.StartAddon(Addon{Name: "bad/name", Bin: "/bin/true"}); err == nil {
		t.Error("an addon named bad/name was started")
	}
	if _, _, err := c.StartAddon(Addon{Name: "far", Bin: "/bin/true", Node: 2}); err == nil {
		t.Error("an addon on node 2 of a one-node cluster was started")
	}

	if err := stopAddons(l); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.AddonRunning("sleeper"); ok || pidRuns(again, "/bin/sleep") {
		t.Error("the addon runs after stopAddons")
	}
	if len(addons(l)) != 0 {
		t.Errorf("addons left after stopAddons: %v", addons(l))
	}
}

// environ reads the environment of process pid. Start returns once the
// child's exec has closed its descriptors, which is a moment before the
// kernel fills in the new program's environment; until then the file is
// empty, so environ reads it again for up to two seconds.
func environ(pid int) (string, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil || len(b) > 0 || time.Now().After(deadline) {
			return string(b), err
		}
		time.Sleep(10 * time.Millisecond)
	}
}
