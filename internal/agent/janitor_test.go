package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestJanitorSweepsAbandonedArchives: the archives of checkpoints the
// agent asked for and built nothing from go once they are ArchiveGrace
// old, whether the kubelet answered (the migration ended before the
// build) or not (the agent died while the runtime wrote the archive);
// archives the agent did not ask for, and those of a checkpoint or build
// under way, stay.
func TestJanitorSweepsAbandonedArchives(t *testing.T) {
	dir := t.TempDir()
	j := newJanitor(Config{CheckpointDir: dir, ArchiveGrace: time.Minute})
	archive := func(pod, ns, container string, at time.Time) string {
		p := filepath.Join(dir, "checkpoint-"+pod+"_"+ns+"-"+container+"-"+at.UTC().Format(time.RFC3339)+".tar")
		if err := os.WriteFile(p, []byte("memory"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }

	// Answered, then abandoned.
	e1, done1, err := j.begin("ns", "a", "app")
	if err != nil {
		t.Fatal(err)
	}
	a1 := archive("a", "ns", "app", time.Now())
	if err := j.taken(e1, a1); err != nil {
		t.Fatal(err)
	}
	done1()
	// Not answered (the agent died); the kubelet wrote it anyway.
	_, done2, err := j.begin("ns", "b", "app")
	if err != nil {
		t.Fatal(err)
	}
	done2()
	a2 := archive("b", "ns", "app", time.Now())
	// kubectl's checkpoint of another pod, and one of pod b's other
	// container "app-x", whose name starts like app's.
	other := archive("c", "ns", "app", time.Now())
	otherContainer := archive("b", "ns", "app-x", time.Now())
	// Under way: a checkpoint in flight, and a build.
	_, done3, err := j.begin("ns", "d", "app")
	if err != nil {
		t.Fatal(err)
	}
	defer done3()
	a3 := archive("d", "ns", "app", time.Now())
	e4, done4, err := j.begin("ns", "e", "app")
	if err != nil {
		t.Fatal(err)
	}
	a4 := archive("e", "ns", "app", time.Now())
	if err := j.taken(e4, a4); err != nil {
		t.Fatal(err)
	}
	done4()
	buildDone := j.building(a4)

	if removed, err := j.sweep(time.Now()); err != nil || len(removed) != 0 {
		t.Fatalf("a sweep within the grace removed %v (%v)", removed, err)
	}
	removed, err := j.sweep(time.Now().Add(2 * time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{a1, a2}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for _, p := range []string{other, otherContainer, a3, a4} {
		if !exists(p) {
			t.Errorf("%s was removed", filepath.Base(p))
		}
	}
	buildDone()
	if removed, _ := j.sweep(time.Now().Add(2 * time.Minute)); !slices.Equal(removed, []string{a4}) {
		t.Errorf("once its build ended (without removing it), the sweep removed %v, want %s", removed, a4)
	}
	// A new janitor (the agent restarted) sweeps the old journal too.
	j2 := newJanitor(Config{CheckpointDir: dir, ArchiveGrace: time.Minute})
	if removed, _ := j2.sweep(time.Now().Add(2 * time.Minute)); !slices.Equal(removed, []string{a3}) {
		t.Errorf("a restarted agent's sweep removed %v, want %s (its checkpoint was the dead agent's)", removed, a3)
	}
}
