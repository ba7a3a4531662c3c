package migrate

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The phase runner takes back what the phases did, newest first, each on
// a live context bounded by Timeouts.Cleanup even when the migration's
// context has ended; a guard that handles the failure keeps everything
// older; a commit drops what was pushed.
func TestRunPhasesUnwindsNewestFirst(t *testing.T) {
	var did []string
	step := func(name string, fail error) undoStep {
		return undoStep{name: name, done: name + " undone", fn: func(ctx context.Context) error {
			if ctx.Err() != nil {
				t.Errorf("undo %s ran on an ended context", name)
			}
			if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > time.Minute {
				t.Errorf("undo %s: deadline %v, %v: want one within Timeouts.Cleanup", name, dl, ok)
			}
			did = append(did, name)
			return fail
		}}
	}
	ok := func(context.Context) error { return nil }
	boom := errors.New("boom")

	for name, tc := range map[string]struct {
		phases  func(r *run) []phase
		wantDid []string
		wantErr []string // substrings, in order
	}{
		"newest first": {
			phases: func(r *run) []phase {
				return []phase{
					{name: "a", do: ok, undo: []undoStep{step("a1", nil), step("a2", nil)}},
					{name: "b", do: ok, undo: []undoStep{step("b", errors.New("b failed"))}},
					{name: "c", do: func(context.Context) error { return boom }, undo: []undoStep{step("c", nil)}},
				}
			},
			wantDid: []string{"b", "a2", "a1"},
			wantErr: []string{"migration m: boom", "b failed", "(a2 undone)", "(a1 undone)"},
		},
		"a guard keeps what is older": {
			phases: func(r *run) []phase {
				guarded := step("g", nil)
				guarded.guard = func(_ context.Context, cause error) (bool, error) { return true, errors.New("kept: " + cause.Error()) }
				return []phase{
					{name: "a", do: ok, undo: []undoStep{step("a", nil)}},
					{name: "g", do: ok, undo: []undoStep{guarded}},
					{name: "x", do: func(context.Context) error { return boom }},
				}
			},
			wantDid: nil,
			wantErr: []string{"kept: migration m: boom"},
		},
		"commit drops the steps": {
			phases: func(r *run) []phase {
				return []phase{
					{name: "a", do: ok, undo: []undoStep{step("a", nil)}},
					{name: "took over", do: func(context.Context) error { r.commit(); return nil }},
					{name: "x", do: func(context.Context) error { return boom }},
				}
			},
			wantDid: nil,
			wantErr: []string{"migration m: boom"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			did = nil
			r := newRun(Env{}, Plan{Name: "m"})
			ctx, cancel := context.WithCancel(t.Context())
			cancel() // the migration's context has ended: the undo still runs
			err := r.runPhases(ctx, tc.phases(r)...)
			if diff := cmp.Diff(tc.wantDid, did); diff != "" {
				t.Errorf("undone (-want +got):\n%s", diff)
			}
			if err == nil {
				t.Fatal("no error")
			}
			msg, at := err.Error(), 0
			for _, w := range tc.wantErr {
				i := strings.Index(msg[at:], w)
				if i < 0 {
					t.Fatalf("error %q: want %q after position %d", msg, w, at)
				}
				at += i + len(w)
			}
			if !errors.Is(err, boom) && name != "a guard keeps what is older" {
				t.Errorf("error %v does not wrap the phase's", err)
			}
			if len(r.undo) != 0 {
				t.Errorf("%d undo steps left after the failure", len(r.undo))
			}
		})
	}
}

func TestTimeoutsDefaults(t *testing.T) {
	got := Timeouts{Stop: time.Second}.withDefaults()
	want := DefaultTimeouts
	want.Stop = time.Second
	if got != want {
		t.Errorf("withDefaults = %+v, want %+v", got, want)
	}
}
