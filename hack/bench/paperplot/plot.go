package paperplot

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Run is one migration's figures, in seconds.
type Run struct {
	Strategy  string
	Rate      float64 // the producer's, msg/s
	TotalS    float64
	DowntimeS float64
	// Phases is the time per phase group (Options.Groups).
	Phases map[string]float64
}

// Metric picks a figure of a Run.
type Metric int

const (
	Total Metric = iota
	Downtime
)

func (m Metric) of(r Run) float64 {
	if m == Downtime {
		return r.DowntimeS
	}
	return r.TotalS
}

func (m Metric) String() string {
	if m == Downtime {
		return "downtime"
	}
	return "total migration time"
}

// Point is the mean and spread of one metric over the runs at one rate.
type Point struct {
	Rate, Mean, Min, Max float64
	N                    int
}

// Series is strategy's metric per rate, in rate order.
func Series(runs []Run, strategy string, m Metric) []Point {
	byRate := map[float64][]float64{}
	for _, r := range runs {
		if r.Strategy == strategy {
			byRate[r.Rate] = append(byRate[r.Rate], m.of(r))
		}
	}
	var out []Point
	for _, rate := range sortedKeys(byRate) {
		vs := byRate[rate]
		out = append(out, Point{Rate: rate, Mean: mean(vs), Min: slices.Min(vs), Max: slices.Max(vs), N: len(vs)})
	}
	return out
}

// Bars is the mean of metric m at rate for each of strategies, 0 where a
// strategy has no run at that rate.
func Bars(runs []Run, rate float64, strategies []string, m Metric) []float64 {
	out := make([]float64, len(strategies))
	for i, s := range strategies {
		var vs []float64
		for _, r := range runs {
			if r.Strategy == s && r.Rate == rate {
				vs = append(vs, m.of(r))
			}
		}
		if len(vs) > 0 {
			out[i] = mean(vs)
		}
	}
	return out
}

// Stack is strategy's mean time per phase group and rate: rates in order,
// and means[g][i] the mean of groups[g] at rates[i].
func Stack(runs []Run, strategy string, groups []string) (rates []float64, means [][]float64) {
	byRate := map[float64][]Run{}
	for _, r := range runs {
		if r.Strategy == strategy {
			byRate[r.Rate] = append(byRate[r.Rate], r)
		}
	}
	rates = sortedKeys(byRate)
	means = make([][]float64, len(groups))
	for g, name := range groups {
		means[g] = make([]float64, len(rates))
		for i, rate := range rates {
			var vs []float64
			for _, r := range byRate[rate] {
				vs = append(vs, r.Phases[name])
			}
			means[g][i] = mean(vs)
		}
	}
	return rates, means
}

// Options say what to draw.
type Options struct {
	// Strategies in the order of the bars and files.
	Strategies []string
	// BarRates are the rates that get a side-by-side figure.
	BarRates []float64
	// Groups are the phase groups, bottom first.
	Groups []string
	// Stacked are the strategies that get a phase breakdown (default:
	// all of Strategies).
	Stacked []string
}

// Files are the names Write uses.
func TimeFile(strategy string) string { return "time-vs-rate-" + strategy + ".png" }
func RateFile(rate float64) string    { return "strategies-at-" + fmtRate(rate) + ".png" }
func PhaseFile(strategy string) string {
	return "phases-" + strategy + ".png"
}

// Write draws every figure that runs have data for into dir and returns
// the files written.
func Write(dir string, runs []Run, o Options) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	save := func(p *plot.Plot, name string, w vg.Length) error {
		path := filepath.Join(dir, name)
		if err := p.Save(w, 10*vg.Centimeter, path); err != nil {
			return fmt.Errorf("draw %s: %w", path, err)
		}
		files = append(files, path)
		return nil
	}
	for _, s := range o.Strategies {
		if len(Series(runs, s, Total)) == 0 {
			continue
		}
		p, err := timePlot(runs, s)
		if err != nil {
			return files, err
		}
		if err := save(p, TimeFile(s), 14*vg.Centimeter); err != nil {
			return files, err
		}
	}
	for _, rate := range o.BarRates {
		if !slices.ContainsFunc(runs, func(r Run) bool { return r.Rate == rate }) {
			continue
		}
		p, err := ratePlot(runs, rate, o.Strategies)
		if err != nil {
			return files, err
		}
		if err := save(p, RateFile(rate), 18*vg.Centimeter); err != nil {
			return files, err
		}
	}
	stacked := o.Stacked
	if stacked == nil {
		stacked = o.Strategies
	}
	for _, s := range stacked {
		rates, means := Stack(runs, s, o.Groups)
		if len(rates) == 0 {
			continue
		}
		p, err := phasePlot(s, rates, means, o.Groups)
		if err != nil {
			return files, err
		}
		if err := save(p, PhaseFile(s), 14*vg.Centimeter); err != nil {
			return files, err
		}
	}
	return files, nil
}

// timePlot is one strategy's total time and downtime against the rate,
// means with min-max bars (the paper's Figs 5-8).
func timePlot(runs []Run, strategy string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = strategy + ": migration time and downtime"
	p.X.Label.Text = "message rate λ (msg/s)"
	p.Y.Label.Text = "seconds (mean, min-max)"
	p.Legend.Top = true
	p.Legend.Left = true
	for i, m := range []Metric{Total, Downtime} {
		pts := errPoints(Series(runs, strategy, m))
		line, dots, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		line.Color, dots.Color = plotutil.Color(i), plotutil.Color(i)
		dots.Shape = plotutil.Shape(i)
		bars, err := plotter.NewYErrorBars(pts)
		if err != nil {
			return nil, err
		}
		bars.Color = plotutil.Color(i)
		p.Add(line, dots, bars)
		p.Legend.Add(m.String(), line, dots)
	}
	p.Y.Min = 0
	return p, nil
}

// ratePlot is every strategy's mean total time and downtime at one rate
// (the paper's Figs 9-11).
func ratePlot(runs []Run, rate float64, strategies []string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "strategies at λ = " + fmtRate(rate) + " msg/s"
	p.Y.Label.Text = "seconds (mean)"
	p.Legend.Top = true
	w := vg.Points(18)
	for i, m := range []Metric{Total, Downtime} {
		b, err := plotter.NewBarChart(plotter.Values(Bars(runs, rate, strategies, m)), w)
		if err != nil {
			return nil, err
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = vg.Length(2*i-1) * w / 2
		p.Add(b)
		p.Legend.Add(m.String(), b)
	}
	p.NominalX(strategies...)
	return p, nil
}

// phasePlot is one strategy's phases stacked per rate (the paper's Figs
// 12-14).
func phasePlot(strategy string, rates []float64, means [][]float64, groups []string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = strategy + ": phases of a migration"
	p.X.Label.Text = "message rate λ (msg/s)"
	p.Y.Label.Text = "seconds (mean)"
	p.Legend.Top = true
	var below *plotter.BarChart
	for g, name := range groups {
		b, err := plotter.NewBarChart(plotter.Values(means[g]), vg.Points(20))
		if err != nil {
			return nil, err
		}
		b.Color = plotutil.Color(g)
		b.LineStyle.Width = 0
		if below != nil {
			b.StackOn(below)
		}
		below = b
		p.Add(b)
		p.Legend.Add(name, b)
	}
	labels := make([]string, len(rates))
	for i, r := range rates {
		labels[i] = fmtRate(r)
	}
	p.NominalX(labels...)
	return p, nil
}

// errPoints draws Points as XYs with asymmetric error bars.
type errPoints []Point

func (e errPoints) Len() int                    { return len(e) }
func (e errPoints) XY(i int) (float64, float64) { return e[i].Rate, e[i].Mean }
func (e errPoints) YError(i int) (float64, float64) {
	return e[i].Mean - e[i].Min, e[i].Max - e[i].Mean
}

func mean(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := 0.0
	for _, v := range vs {
		s += v
	}
	return s / float64(len(vs))
}

func sortedKeys[V any](m map[float64]V) []float64 {
	ks := make([]float64, 0, len(m))
	for k := range m {
		if !math.IsNaN(k) {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}

func fmtRate(r float64) string { return strconv.FormatFloat(r, 'g', -1, 64) }
