package paperplot

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var groups = []string{"checkpoint", "image", "restore", "replay"}

// synthetic is a small result set: two strategies, two rates, two runs
// each.
func synthetic() []Run {
	ph := func(c, i, r, p float64) map[string]float64 {
		return map[string]float64{"checkpoint": c, "image": i, "restore": r, "replay": p}
	}
	return []Run{
		{Strategy: "stop-and-copy", Rate: 4, TotalS: 3, DowntimeS: 3, Phases: ph(0.3, 0.1, 2.6, 0)},
		{Strategy: "stop-and-copy", Rate: 4, TotalS: 5, DowntimeS: 4, Phases: ph(0.5, 0.1, 4.4, 0)},
		{Strategy: "stop-and-copy", Rate: 16, TotalS: 4, DowntimeS: 4, Phases: ph(0.4, 0.1, 3.5, 0)},
		{Strategy: "ms2m", Rate: 16, TotalS: 15, DowntimeS: 0.004, Phases: ph(0.3, 0.1, 2.6, 12)},
		{Strategy: "ms2m", Rate: 4, TotalS: 4, DowntimeS: 0.003, Phases: ph(0.3, 0.1, 2.6, 1)},
		{Strategy: "ms2m", Rate: 4, TotalS: 2, DowntimeS: 0.005, Phases: ph(0.3, 0.1, 2.6, 0)},
	}
}

func TestSeries(t *testing.T) {
	runs := synthetic()
	want := []Point{{Rate: 4, Mean: 3, Min: 2, Max: 4, N: 2}, {Rate: 16, Mean: 15, Min: 15, Max: 15, N: 1}}
	if diff := cmp.Diff(want, Series(runs, "ms2m", Total)); diff != "" {
		t.Errorf("ms2m total (-want +got):\n%s", diff)
	}
	want = []Point{{Rate: 4, Mean: 3.5, Min: 3, Max: 4, N: 2}, {Rate: 16, Mean: 4, Min: 4, Max: 4, N: 1}}
	if diff := cmp.Diff(want, Series(runs, "stop-and-copy", Downtime)); diff != "" {
		t.Errorf("stop-and-copy downtime (-want +got):\n%s", diff)
	}
	if got := Series(runs, "statefulset", Total); len(got) != 0 {
		t.Errorf("a strategy without runs: %v, want no points", got)
	}
}

func TestBars(t *testing.T) {
	got := Bars(synthetic(), 16, []string{"stop-and-copy", "ms2m", "statefulset"}, Total)
	if diff := cmp.Diff([]float64{4, 15, 0}, got); diff != "" {
		t.Errorf("bars at 16 (-want +got):\n%s", diff)
	}
}

func TestStack(t *testing.T) {
	rates, means := Stack(synthetic(), "ms2m", groups)
	if diff := cmp.Diff([]float64{4, 16}, rates); diff != "" {
		t.Errorf("rates (-want +got):\n%s", diff)
	}
	want := [][]float64{{0.3, 0.3}, {0.1, 0.1}, {2.6, 2.6}, {0.5, 12}}
	if diff := cmp.Diff(want, means); diff != "" {
		t.Errorf("means[group][rate] (-want +got):\n%s", diff)
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	files, err := Write(dir, synthetic(), Options{
		Strategies: []string{"stop-and-copy", "ms2m", "statefulset"},
		BarRates:   []float64{4, 10, 16},
		Groups:     groups,
	})
	if err != nil {
		t.Fatal(err)
	}
	// statefulset has no runs and nothing ran at 10: no figure for either.
	want := []string{
		TimeFile("stop-and-copy"), TimeFile("ms2m"),
		RateFile(4), RateFile(16),
		PhaseFile("stop-and-copy"), PhaseFile("ms2m"),
	}
	for i := range want {
		want[i] = filepath.Join(dir, want[i])
	}
	if diff := cmp.Diff(want, files); diff != "" {
		t.Fatalf("files (-want +got):\n%s", diff)
	}
	heights := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == 0 {
			t.Errorf("%s is empty", f)
			continue
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Errorf("%s is not a PNG: %v", f, err)
			continue
		}
		if r := img.Bounds(); r.Dx() < 100 || r.Dy() < 100 {
			t.Errorf("%s is %dx%d pixels, want a real figure", f, r.Dx(), r.Dy())
		}
		heights[filepath.Base(f)] = img.Bounds().Dy()
	}
	// Time and downtime differ by orders of magnitude: the time and rate
	// figures have a panel for each, the phase figures one.
	one := heights[PhaseFile("ms2m")]
	for _, f := range []string{TimeFile("ms2m"), RateFile(16)} {
		if h := heights[f]; h != 2*one {
			t.Errorf("%s is %d pixels high, want two panels of %d", f, h, one)
		}
	}
}

func TestRoundTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		want   []string
	}{
		{1, 19, []string{"2", "4", "6", "8", "10", "12", "14", "16", "18"}},
		{0, 78, []string{"0", "10", "20", "30", "40", "50", "60", "70"}},
		{0, 2900, []string{"0", "500", "1000", "1500", "2000", "2500"}},
		{0, 0.03, []string{"0", "0.005", "0.01", "0.015", "0.02", "0.025", "0.03"}},
	} {
		var got []string
		for _, tk := range (roundTicks{}).Ticks(c.lo, c.hi) {
			got = append(got, tk.Label)
		}
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("ticks of %g..%g (-want +got):\n%s", c.lo, c.hi, diff)
		}
	}
}
