package soak

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func rec(mode string, i int, strategy string, res Result, out Outcome, totalMS float64) Record {
	return Record{Mode: mode, Index: i, Strategy: strategy, Result: res, Outcome: out, TotalMS: totalMS, At: time.Unix(1_800_000_000, 0).UTC()}
}

func mustAppend(t *testing.T, path string, r Record) {
	t.Helper()
	if err := Append(path, r); err != nil {
		t.Fatal(err)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	gap := 812.5
	want := rec("sim", 3, "ms2m", RolledBack, Exact, 7400)
	want.Fault, want.GapMS, want.Seed = "push refused", &gap, 42
	line, err := want.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(line), "}\n") || strings.Count(string(line), "\n") != 1 {
		t.Fatalf("a record is one line: %q", line)
	}
	got, err := ParseRecord(line)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func TestValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		r    Record
		want string // in the error; "" for none
	}{
		"good":             {r: rec("pingpong", 1, "ms2m", Completed, Exact, 1)},
		"no mode":          {r: rec("", 1, "ms2m", Completed, Exact, 1), want: "no mode"},
		"index 0":          {r: rec("pingpong", 0, "ms2m", Completed, Exact, 1), want: "index 0"},
		"no strategy":      {r: rec("pingpong", 1, "", Completed, Exact, 1), want: "no strategy"},
		"unknown result":   {r: rec("pingpong", 1, "ms2m", "done", Exact, 1), want: `result "done"`},
		"unknown outcome":  {r: rec("pingpong", 1, "ms2m", Completed, "fine", 1), want: `outcome "fine"`},
		"negative total":   {r: rec("pingpong", 1, "ms2m", Completed, Exact, -1), want: "negative"},
		"two things wrong": {r: rec("", 1, "", Completed, Exact, 1), want: "no strategy"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.r.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestFolderLockAndResume(t *testing.T) {
	dir := t.TempDir()
	f, err := Open(dir, "pingpong")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := Open(dir, "pingpong"); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second Open of held records: %v, want ErrBusy", err)
	}
	other, err := Open(dir, "sim")
	if err != nil {
		t.Fatalf("Open of another mode's records in the same folder: %v", err)
	}
	other.Close()
	if _, err := Open(dir, "../x"); err == nil {
		t.Errorf("Open of mode ../x: want an error")
	}
	for i := 1; i <= 3; i++ {
		if err := Append(f.Path(), rec("pingpong", i, "ms2m", Completed, Exact, float64(i))); err != nil {
			t.Fatal(err)
		}
	}
	// A run killed in the middle of a write leaves half a line.
	fh, err := os.OpenFile(f.Path(), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteString(`{"mode":"pingpong","ind`); err != nil {
		t.Fatal(err)
	}
	if err := fh.Close(); err != nil {
		t.Fatal(err)
	}
	recs, dropped, err := f.Records()
	if err != nil || len(recs) != 3 || dropped != len(`{"mode":"pingpong","ind`) {
		t.Fatalf("Records: %d records, %d bytes dropped, %v; want 3 and the half line", len(recs), dropped, err)
	}
	if err := Append(f.Path(), rec("pingpong", 4, "ms2m", Completed, Exact, 4)); err != nil {
		t.Fatal(err)
	}
	if n, err := f.count(t.Logf); err != nil || n != 4 {
		t.Fatalf("after the cut and one more record: %d, %v; want 4", n, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	g, err := Open(dir, "pingpong")
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	g.Close()
}

func TestPathIsAbsolute(t *testing.T) {
	t.Chdir(t.TempDir())
	f, err := Open("out", "pingpong")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !filepath.IsAbs(f.Path()) {
		t.Errorf("Path() = %s, want an absolute path (a chunk's child process runs in another folder)", f.Path())
	}
}

func TestCountRejectsForeignLines(t *testing.T) {
	dir := t.TempDir()
	f, err := Open(dir, "sim")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mustAppend(t, f.Path(), rec("sim", 1, "ms2m", Completed, Exact, 1))
	mustAppend(t, f.Path(), rec("sim", 3, "ms2m", Completed, Exact, 1))
	if _, err := f.count(t.Logf); err == nil || !strings.Contains(err.Error(), "want record 2") {
		t.Errorf("a gap in the numbering: %v, want an error", err)
	}
	b, err := Open(dir, "bad")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := os.WriteFile(b.Path(), []byte("{\"mode\":\"bad\"}\nnot json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Records(); err == nil || !strings.Contains(err.Error(), "bad.jsonl:1") {
		t.Errorf("a bad line: %v, want an error naming it", err)
	}
}

// fakeMode records n migrations per chunk, or as many as it is told.
type fakeMode struct {
	chunks []Chunk
	per    func(c Chunk) int // records per chunk
	err    error
	stop   context.CancelFunc // called after the first chunk, if set
}

func (m *fakeMode) Name() string { return "fake" }

func (m *fakeMode) Chunk(ctx context.Context, c Chunk) error {
	m.chunks = append(m.chunks, c)
	n := c.N
	if m.per != nil {
		n = m.per(c)
	}
	for i := range n {
		if err := Append(c.Records, rec("fake", c.First+i, "ms2m", Completed, Exact, 1)); err != nil {
			return err
		}
	}
	if m.stop != nil {
		m.stop()
	}
	return m.err
}

func TestRun(t *testing.T) {
	now := func() time.Time { return time.Unix(0, 0) }
	t.Run("chunks up to the count", func(t *testing.T) {
		f, _ := Open(t.TempDir(), "fake")
		defer f.Close()
		m := &fakeMode{}
		if err := Run(t.Context(), f, m, Options{Count: 7, ChunkSize: 3, Seed: 9, Now: now}); err != nil {
			t.Fatal(err)
		}
		var got [][2]int
		for _, c := range m.chunks {
			got = append(got, [2]int{c.First, c.N})
			if c.Seed != 9 || c.Records != f.Path() {
				t.Errorf("chunk %+v: want seed 9 and the fake file", c)
			}
		}
		if diff := cmp.Diff([][2]int{{1, 3}, {4, 3}, {7, 1}}, got); diff != "" {
			t.Errorf("chunks (first, n) (-want +got)\n%s", diff)
		}
	})
	t.Run("resumes and stops", func(t *testing.T) {
		f, _ := Open(t.TempDir(), "fake")
		defer f.Close()
		ctx, cancel := context.WithCancel(t.Context())
		m := &fakeMode{stop: cancel, per: func(Chunk) int { return 2 }}
		if err := Run(ctx, f, m, Options{Count: 10, ChunkSize: 5, Now: now}); !errors.Is(err, context.Canceled) {
			t.Fatalf("a stopped run: %v, want context.Canceled", err)
		}
		if len(m.chunks) != 1 {
			t.Fatalf("%d chunks after the stop, want 1", len(m.chunks))
		}
		m2 := &fakeMode{}
		if err := Run(t.Context(), f, m2, Options{Count: 10, ChunkSize: 5, Now: now}); err != nil {
			t.Fatal(err)
		}
		if m2.chunks[0].First != 3 {
			t.Errorf("the resumed run starts at %d, want 3", m2.chunks[0].First)
		}
		if n, _ := f.count(t.Logf); n != 10 {
			t.Errorf("%d records, want 10", n)
		}
		m3 := &fakeMode{}
		if err := Run(t.Context(), f, m3, Options{Count: 10, ChunkSize: 5, Now: now}); err != nil || len(m3.chunks) != 0 {
			t.Errorf("a run of a full file: %v, %d chunks; want nothing to do", err, len(m3.chunks))
		}
	})
	t.Run("gives up on fruitless chunks", func(t *testing.T) {
		f, _ := Open(t.TempDir(), "fake")
		defer f.Close()
		boom := errors.New("the cluster did not come up")
		m := &fakeMode{per: func(Chunk) int { return 0 }, err: boom}
		err := Run(t.Context(), f, m, Options{Count: 5, ChunkSize: 5, Tries: 2, Now: now})
		if !errors.Is(err, boom) || len(m.chunks) != 2 {
			t.Errorf("Run: %v after %d chunks; want the chunk's error after 2", err, len(m.chunks))
		}
	})
}

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, tc := range []struct{ p, want float64 }{{50, 5}, {95, 10}, {90, 9}, {0, 1}, {100, 10}} {
		if got := Percentile(xs, tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("p50 of nothing = %v, want NaN", got)
	}
	if xs[0] != 5 {
		t.Errorf("Percentile sorted its input")
	}
}

func TestSummarize(t *testing.T) {
	gap := 300.0
	recs := []Record{
		rec("pingpong", 1, "ms2m", Completed, Exact, 8000),
		rec("pingpong", 2, "ms2m", Completed, Exact, 6000),
		rec("pingpong", 3, "statefulset-shadow", Completed, Exact, 16000),
		rec("pingpong", 4, "ms2m", Failed, Stuck, 240000),
		rec("sim", 1, "ms2m", RolledBack, Exact, 3000),
		rec("sim", 2, "ms2m", Completed, Doubled, 3000),
	}
	recs[0].GapMS, recs[0].DowntimeMS = &gap, 500
	rows := Summarize(recs, ByStrategy)
	var got []string
	for _, r := range rows {
		got = append(got, r.Mode+"/"+r.Key)
	}
	if diff := cmp.Diff([]string{"pingpong/ms2m", "pingpong/statefulset-shadow", "pingpong/all", "sim/ms2m"}, got); diff != "" {
		t.Fatalf("rows (-want +got)\n%s", diff)
	}
	ms2m := rows[0]
	if ms2m.Migrations != 3 || ms2m.Completed != 2 || ms2m.Failed != 1 || ms2m.Exact != 2 || ms2m.Stuck != 1 {
		t.Errorf("ms2m row %+v", ms2m)
	}
	if ms2m.TotalP50 != 6000 || ms2m.TotalP95 != 8000 {
		t.Errorf("ms2m totals p50 %v p95 %v, want 6000 and 8000 (of the completed, exact ones)", ms2m.TotalP50, ms2m.TotalP95)
	}
	if ms2m.Gaps != 1 || ms2m.GapP50 != 300 || ms2m.DowntimeP50 != 500 {
		t.Errorf("ms2m gaps %d p50 %v, downtime p50 %v", ms2m.Gaps, ms2m.GapP50, ms2m.DowntimeP50)
	}
	if all := rows[2]; all.Migrations != 4 || all.Exact != 3 {
		t.Errorf("pingpong/all %+v", all)
	}
	if sim := rows[3]; sim.RolledBack != 1 || sim.Doubled != 1 || !math.IsNaN(sim.TotalP50) {
		t.Errorf("sim row %+v: want one rollback, one doubled, no total", sim)
	}
	var b strings.Builder
	if err := WriteMarkdown(&b, "strategy", rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "| pingpong | ms2m | 3 | 2 | 0 | 1 | 2 | 0 | 0 | 1 | 6.0 / 8.0 | 0.50 / 0.50 | 300 / 300 |") {
		t.Errorf("markdown:\n%s", b.String())
	}
}

func TestReadDir(t *testing.T) {
	dir := t.TempDir()
	mustAppend(t, filepath.Join(dir, "sim.jsonl"), rec("sim", 1, "ms2m", Completed, Exact, 1))
	mustAppend(t, filepath.Join(dir, "pingpong.jsonl"), rec("pingpong", 1, "ms2m", Completed, Exact, 1))
	recs, err := ReadDir(dir)
	if err != nil || len(recs) != 2 || recs[0].Mode != "pingpong" {
		t.Errorf("ReadDir: %v, %v", recs, err)
	}
	if _, err := ReadDir(t.TempDir()); err == nil {
		t.Errorf("ReadDir of an empty folder: want an error")
	}
}
