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
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
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
	// X is what Run.Rate holds: the default is the message rate; the
	// memory sweep puts the state's size there.
	X Axis
	// Y names the time figures' panels: the default is the migration's
	// total time and downtime; the drain bench draws a drain's time and
	// its pods' processing gap there.
	Y YLabels
}

// YLabels name what a time figure's two panels show (TotalS above,
// DowntimeS below) and its title after the strategy; an empty field keeps
// the default.
type YLabels struct{ Total, Downtime, Title string }

// Axis names the x axis: Name goes into the time figures' file names
// (time-vs-<name>-<strategy>.png), Label under the axis.
type Axis struct{ Name, Label string }

// rateAxis is the default x axis.
var rateAxis = Axis{Name: "rate", Label: "message rate λ (msg/s)"}

// Files are the names Write uses.
func TimeFile(strategy string) string { return timeFile(rateAxis, strategy) }

func timeFile(x Axis, strategy string) string { return "time-vs-" + x.Name + "-" + strategy + ".png" }
func RateFile(rate float64) string            { return "strategies-at-" + fmtRate(rate) + ".png" }
func PhaseFile(strategy string) string {
	return "phases-" + strategy + ".png"
}

// Write draws every figure that runs have data for into dir and returns
// the files written.
func Write(dir string, runs []Run, o Options) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if o.X.Name == "" {
		o.X = rateAxis
	}
	var files []string
	save := func(name string, w vg.Length, panels ...*plot.Plot) error {
		path := filepath.Join(dir, name)
		if err := savePanels(path, w, 10*vg.Centimeter, panels); err != nil {
			return fmt.Errorf("draw %s: %w", path, err)
		}
		files = append(files, path)
		return nil
	}
	for _, s := range o.Strategies {
		if len(Series(runs, s, Total)) == 0 {
			continue
		}
		total, down, err := timePlots(runs, s, o.X.Label, o.Y)
		if err != nil {
			return files, err
		}
		if err := save(timeFile(o.X, s), 14*vg.Centimeter, total, down); err != nil {
			return files, err
		}
	}
	for _, rate := range o.BarRates {
		if !slices.ContainsFunc(runs, func(r Run) bool { return r.Rate == rate }) {
			continue
		}
		total, down, err := ratePlots(runs, rate, o.Strategies)
		if err != nil {
			return files, err
		}
		if err := save(RateFile(rate), 18*vg.Centimeter, total, down); err != nil {
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
		p, err := phasePlot(s, rates, means, o.Groups, o.X.Label)
		if err != nil {
			return files, err
		}
		if err := save(PhaseFile(s), 14*vg.Centimeter, p); err != nil {
			return files, err
		}
	}
	return files, nil
}

// savePanels draws panels one above the other, each width × height, into
// the PNG file path.
func savePanels(path string, width, height vg.Length, panels []*plot.Plot) error {
	img := vgimg.New(width, height*vg.Length(len(panels)))
	dc := draw.New(img)
	rows := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		rows[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4, PadY: vg.Millimeter * 6}
	canvases := plot.Align(rows, tiles, dc)
	for i, p := range panels {
		p.Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// The two metrics differ by up to three orders of magnitude (seconds of
// migration, milliseconds of downtime), so each figure draws them in
// panels of their own: total time in seconds above, downtime in
// milliseconds below.
var (
	totalAxis    = axis{label: "total migration time (s)", scale: 1, color: 0}
	downtimeAxis = axis{label: "downtime (ms)", scale: 1000, color: 1}
)

type axis struct {
	label string
	scale float64 // from seconds
	color int
}

// timePlots are one strategy's total time and downtime against the rate,
// means with min-max bars (the paper's Figs 5-8).
func timePlots(runs []Run, strategy, xLabel string, y YLabels) (total, downtime *plot.Plot, err error) {
	ta, da, title := totalAxis, downtimeAxis, strategy+": migration time and downtime"
	if y.Total != "" {
		ta.label = y.Total
	}
	if y.Downtime != "" {
		da.label = y.Downtime
	}
	if y.Title != "" {
		title = strategy + ": " + y.Title
	}
	panel := func(m Metric, a axis, title string) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = xLabel
		p.Y.Label.Text = a.label + ", mean and min-max"
		pts := errPoints(scaled(Series(runs, strategy, m), a.scale))
		line, dots, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		line.Color, dots.Color = plotutil.Color(a.color), plotutil.Color(a.color)
		dots.Shape = plotutil.Shape(a.color)
		bars, err := plotter.NewYErrorBars(pts)
		if err != nil {
			return nil, err
		}
		bars.Color = plotutil.Color(a.color)
		p.Add(line, dots, bars, plotter.NewGrid())
		p.X.Tick.Marker, p.Y.Tick.Marker = roundTicks{}, roundTicks{}
		p.Y.Min = 0
		return p, nil
	}
	if total, err = panel(Total, ta, title); err != nil {
		return nil, nil, err
	}
	downtime, err = panel(Downtime, da, "")
	return total, downtime, err
}

// ratePlots are every strategy's mean total time and downtime at one rate
// (the paper's Figs 9-11).
func ratePlots(runs []Run, rate float64, strategies []string) (total, downtime *plot.Plot, err error) {
	panel := func(m Metric, a axis, title string) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.Y.Label.Text = a.label + ", mean"
		vs := Bars(runs, rate, strategies, m)
		for i := range vs {
			vs[i] *= a.scale
		}
		b, err := plotter.NewBarChart(plotter.Values(vs), vg.Points(24))
		if err != nil {
			return nil, err
		}
		b.Color = plotutil.Color(a.color)
		b.LineStyle.Width = 0
		// Each bar carries its value: a downtime of milliseconds beside
		// one of seconds is too short to read off the axis.
		var xys plotter.XYs
		var texts []string
		top := 0.0
		for i, v := range vs {
			xys = append(xys, plotter.XY{X: float64(i), Y: v})
			texts = append(texts, valueLabel(v))
			top = max(top, v)
		}
		labels, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
		if err != nil {
			return nil, err
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i].XAlign = draw.XCenter
		}
		labels.Offset = vg.Point{Y: vg.Points(2)}
		p.Add(b, labels)
		p.NominalX(strategies...)
		p.X.Min, p.X.Max = -0.6, float64(len(strategies))-0.4
		p.Y.Tick.Marker = roundTicks{}
		p.Y.Min, p.Y.Max = 0, 1.15*top
		return p, nil
	}
	if total, err = panel(Total, totalAxis, "strategies at λ = "+fmtRate(rate)+" msg/s"); err != nil {
		return nil, nil, err
	}
	downtime, err = panel(Downtime, downtimeAxis, "")
	return total, downtime, err
}

// roundTicks labels an axis every 1, 2 or 5 times a power of ten, with
// no more than 10 labels and no trailing zeros.
type roundTicks struct{}

func (roundTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: valueLabel(lo)}}
	}
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/10)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(step*m) <= 10 {
			step *= m
			break
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		v = math.Round(v/step) * step
		ticks = append(ticks, plot.Tick{Value: v, Label: valueLabel(v)})
	}
	return ticks
}

// valueLabel is v with at most three significant digits after the
// point, and none that are zero.
func valueLabel(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100 || a == 0:
		return strconv.FormatFloat(math.Round(v), 'f', -1, 64)
	case a >= 10:
		return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// scaled is pts with every value multiplied by f.
func scaled(pts []Point, f float64) []Point {
	out := make([]Point, len(pts))
	for i, p := range pts {
		out[i] = Point{Rate: p.Rate, Mean: p.Mean * f, Min: p.Min * f, Max: p.Max * f, N: p.N}
	}
	return out
}

// phasePlot is one strategy's phases stacked per rate (the paper's Figs
// 12-14).
func phasePlot(strategy string, rates []float64, means [][]float64, groups []string, xLabel string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = strategy + ": phases of a migration"
	p.X.Label.Text = xLabel
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
	top := 0.0
	for i, r := range rates {
		labels[i] = fmtRate(r)
		sum := 0.0
		for g := range groups {
			sum += means[g][i]
		}
		top = max(top, sum)
	}
	p.NominalX(labels...)
	p.Y.Tick.Marker = roundTicks{}
	// Room above the tallest bar for the legend.
	p.Y.Min, p.Y.Max = 0, top*(1.1+0.07*float64(len(groups)))
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
