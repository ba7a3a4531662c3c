package migrate

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestCRIULogSpan reads how long CRIU ran from the stamps of its log, as
// runc has it write restore.log (log level 4), whole or as the agent's
// tail of it that starts mid-line.
func TestCRIULogSpan(t *testing.T) {
	for name, tc := range map[string]struct {
		log    string
		want   time.Duration
		wantOK bool
	}{
		"whole log": {log: "(00.000000) Will restore in 0 namespaces\n(00.000046) Version: 4.2 (gitid 0)\n(00.081235) pie: 1: Restored\n(00.083221) Restore finished successfully. Tasks resumed.\n(00.083245) Writing stats\n",
			want: 83245 * time.Microsecond, wantOK: true},
		"tail starting mid-line": {log: "s 0x7f2 to 0x7f3\n(01.250001) Restore finished successfully. Tasks resumed.\n(01.250100) Writing stats",
			want: 1250100 * time.Microsecond, wantOK: true},
		"lines without stamps between":      {log: "(00.100000) a\ncontinued\n  (00.200000) indented\n", want: 200 * time.Millisecond, wantOK: true},
		"past 99 seconds":                   {log: "(99.999999) a\n(100.000001) b\n", want: 100*time.Second + time.Microsecond, wantOK: true},
		"a stamp going back is not the end": {log: "(00.500000) a\n(00.400000) b\n", want: 500 * time.Millisecond, wantOK: true},
		"no stamps":                         {log: "Error: something\n"},
		"empty":                             {},
		"a stamp not at the start":          {log: "pie says (00.500000) hi\n"},
		"a malformed stamp":                 {log: "(00.5) a\n(ab.123456) b\n"},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := CRIULogSpan(tc.log)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("CRIULogSpan = %s, %v; want %s, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// TestPulledIn reads the kubelet's pull time of one image from its Pulled
// Event's message, and nothing from a message about another image or of
// another form.
func TestPulledIn(t *testing.T) {
	const img = "10.0.0.1:5000/ms2m/checkpoints/ns/m1@sha256:abc"
	for name, tc := range map[string]struct {
		msg         string
		want        time.Duration
		wantPresent bool
		wantOK      bool
	}{
		"ms":                {msg: `Successfully pulled image "` + img + `" in 123ms (130ms including waiting). Image size: 9437184 bytes.`, want: 123 * time.Millisecond, wantOK: true},
		"seconds":           {msg: `Successfully pulled image "` + img + `" in 1.234s (1.5s including waiting). Image size: 1 bytes.`, want: 1234 * time.Millisecond, wantOK: true},
		"minutes":           {msg: `Successfully pulled image "` + img + `" in 1m2.5s (1m3s including waiting)`, want: 62500 * time.Millisecond, wantOK: true},
		"older form":        {msg: `Successfully pulled image "` + img + `" in 456ms. Image size: 2 bytes.`, want: 456 * time.Millisecond, wantOK: true},
		"already present":   {msg: `Container image "` + img + `" already present on machine`, wantPresent: true, wantOK: true},
		"another image":     {msg: `Successfully pulled image "other:1" in 1s (1s including waiting)`},
		"a prefix of it":    {msg: `Successfully pulled image "` + img[:20] + `" in 1s (1s including waiting)`},
		"another present":   {msg: `Container image "other:1" already present on machine`},
		"no duration":       {msg: `Successfully pulled image "` + img + `" in forever (1s including waiting)`},
		"pulling":           {msg: `Pulling image "` + img + `"`},
		"empty":             {},
		"a negative figure": {msg: `Successfully pulled image "` + img + `" in -5s (1s including waiting)`},
	} {
		t.Run(name, func(t *testing.T) {
			got, present, ok := PulledIn(tc.msg, img)
			if got != tc.want || present != tc.wantPresent || ok != tc.wantOK {
				t.Errorf("PulledIn = %s, %v, %v; want %s, %v, %v", got, present, ok, tc.want, tc.wantPresent, tc.wantOK)
			}
		})
	}
}

// TestPartsOf takes the checkpoint call, CRIU's dump, the image and the
// restore from a report, says why CRIU's dump is unmeasured when it is,
// and splits the rests only when both of their parts were measured.
func TestPartsOf(t *testing.T) {
	ms := time.Millisecond
	phases := []Phase{{"preconditions", 30 * ms}, {"prepare target", 20 * ms}, {"quiesce", 5 * ms}, {"checkpoint", 300 * ms},
		{"resume", 3 * ms}, {"image", 40 * ms}, {"restore", 1900 * ms}, {"replay and handover", 2000 * ms}}
	for name, tc := range map[string]struct {
		rep              Report
		dump             time.Duration
		noDump           string
		want             Parts
		wantCallRest     time.Duration
		wantCallRestOK   bool
		wantRestoreRest  time.Duration // with a pull of 100 ms and a CRIU restore of 200 ms
		wantRestoreRestK bool
	}{
		"live, dump seen": {rep: Report{Phases: phases, Hold: &HoldTimings{Call: 290 * ms, CRIU: 90 * ms}},
			want:         Parts{Call: 290 * ms, CRIUDump: 90 * ms, Image: 40 * ms, Restore: 1900 * ms},
			wantCallRest: 200 * ms, wantCallRestOK: true, wantRestoreRest: 1600 * ms, wantRestoreRestK: true},
		"live, no thaw": {rep: Report{Phases: phases, Hold: &HoldTimings{Call: 290 * ms, ThawFallback: "thawing after the dump is off (policy never)"}},
			want: Parts{Call: 290 * ms, Image: 40 * ms, Restore: 1900 * ms,
				Unmeasured: []string{"CRIU dump: the dump watch did not run: thawing after the dump is off (policy never)"}},
			wantRestoreRest: 1600 * ms, wantRestoreRestK: true},
		"live, watch saw nothing": {rep: Report{Phases: phases, Hold: &HoldTimings{Call: 290 * ms}},
			want:            Parts{Call: 290 * ms, Image: 40 * ms, Restore: 1900 * ms, Unmeasured: []string{"CRIU dump: the node's agent saw no dump"}},
			wantRestoreRest: 1600 * ms, wantRestoreRestK: true},
		"stop-and-copy, its own watch": {rep: Report{Phases: []Phase{{"stop", 50 * ms}, {"checkpoint", 280 * ms}, {"image", 40 * ms}, {"restore", 250 * ms}}}, dump: 100 * ms,
			want:         Parts{Call: 280 * ms, CRIUDump: 100 * ms, Image: 40 * ms, Restore: 250 * ms},
			wantCallRest: 180 * ms, wantCallRestOK: true, wantRestoreRestK: true}, // 250 - 100 - 200 is below 0: 0
		"stop-and-copy, no watch": {rep: Report{Phases: []Phase{{"checkpoint", 280 * ms}}}, noDump: "the node agent cannot watch for the dump",
			want:             Parts{Call: 280 * ms, Unmeasured: []string{"CRIU dump: the node agent cannot watch for the dump"}},
			wantRestoreRestK: false},
	} {
		t.Run(name, func(t *testing.T) {
			got := partsOf(tc.rep, tc.dump, tc.noDump)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("partsOf (-want +got):\n%s", diff)
			}
			if d, ok := got.CallRest(); d != tc.wantCallRest || ok != tc.wantCallRestOK {
				t.Errorf("CallRest = %s, %v; want %s, %v", d, ok, tc.wantCallRest, tc.wantCallRestOK)
			}
			got.Pull, got.CRIURestore = 100*ms, 200*ms
			if d, ok := got.RestoreRest(); d != tc.wantRestoreRest || ok != tc.wantRestoreRestK {
				t.Errorf("RestoreRest = %s, %v; want %s, %v", d, ok, tc.wantRestoreRest, tc.wantRestoreRestK)
			}
		})
	}
}

// TestRestoreRestNeedsThePull: a pull that was not measured is not taken
// as 0 (an image already present is).
func TestRestoreRestNeedsThePull(t *testing.T) {
	p := Parts{Restore: time.Second, CRIURestore: 100 * time.Millisecond}
	if d, ok := p.RestoreRest(); !ok || d != 900*time.Millisecond {
		t.Errorf("with the image present: RestoreRest = %s, %v; want 900ms, true", d, ok)
	}
	p.miss(PartPull, "no Pulled Event")
	if d, ok := p.RestoreRest(); ok {
		t.Errorf("with the pull unmeasured: RestoreRest = %s, true; want false", d)
	}
}
