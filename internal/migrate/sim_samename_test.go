package migrate_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
)

// TestRequestsInOneSecondGetTheirOwnNames asks the controller (in this
// process, its clock stopped) to migrate a pod twice within one second;
// its preflight refuses both (the target cannot restore), as it would a
// user or a script asking again at once. Each answer is its own
// migration: a name of its own in the status and the Events, and both in
// the pod's history. Named by the second alone, the second answer took
// the first's name, so that it read as the first's answer written again,
// and the history dropped the first request as recorded already.
func TestRequestsInOneSecondGetTheirOwnNames(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	ctx := t.Context()
	w := deploy(t, c, "sim-samename", "Deployment", true)
	c.Nodes[nodeB].Degrade(func(n *contract.NodeCapabilities) {
		off := false
		n.RestoreEnabled = &off
	})
	events := &notes{}
	r := controller.New(controller.Config{
		Client: c.Client, Events: events, Agent: env(c, c.Client).Agent, ImageRepo: c.ImageRepo(),
		StatusKey: c.SigningKey, Clock: stoppedClock{time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)}, Timeout: time.Minute,
	})
	pods := c.Client.CoreV1().Pods(w.ns)
	var names []string
	for i := range 2 {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, contract.AnnotationMigrateTo, nodeB)
		if _, err := pods.Patch(ctx, w.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: w.ns, Name: w.pod.Name}}); err != nil {
			t.Fatalf("request %d: reconcile: %v", i+1, err)
		}
		p, err := pods.Get(ctx, w.pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := controller.DecodeStatus(p.Annotations[contract.AnnotationMigrationStatus])
		if err != nil || st.Phase != contract.PhaseFailed || !strings.Contains(st.Message, "cannot restore") || st.Name == "" {
			t.Fatalf("request %d: status %+v (%v), want Failed by the preflight, named", i+1, st, err)
		}
		names = append(names, st.Name)
		if i == 1 {
			var hist []string
			for _, e := range st.History {
				hist = append(hist, e.Name)
			}
			if want := []string{names[1], names[0]}; !slices.Equal(hist, want) {
				t.Errorf("the history after both: %q, want both requests, newest first: %q", hist, want)
			}
		}
	}
	if names[0] == names[1] {
		t.Errorf("both requests, one second apart at most, are migration %s", names[0])
	}
	for _, name := range names {
		if got := events.about(name); len(got) != 2 {
			t.Errorf("Events naming migration %s: %q, want its start and its refusal", name, got)
		}
	}
}

// stoppedClock always says the same time.
type stoppedClock struct{ t time.Time }

func (c stoppedClock) Now() time.Time { return c.t }

// notes keeps the notes of the Events it is given.
type notes struct {
	mu  sync.Mutex
	all []string
}

func (n *notes) Eventf(_, _ runtime.Object, _, reason, _, note string, args ...any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.all = append(n.all, reason+": "+fmt.Sprintf(note, args...))
}

// about returns the notes that name migration.
func (n *notes) about(migration string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, s := range n.all {
		if strings.Contains(s, "migration "+migration+":") || strings.Contains(s, "migration "+migration+" ") {
			out = append(out, s)
		}
	}
	return out
}
