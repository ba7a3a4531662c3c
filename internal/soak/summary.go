package soak

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Row is the summary of a group of records.
type Row struct {
	Mode, Key                     string // Key: the strategy, the fault, or "all"
	Migrations                    int
	Completed, RolledBack, Failed int
	Exact, Lost, Doubled, Stuck   int
	// Totals, downtimes and gaps, in ms: the p50 and p95 of the records
	// that have them (NaN where none has).
	TotalP50, TotalP95       float64
	DowntimeP50, DowntimeP95 float64
	GapP50, GapP95           float64
	Gaps                     int // how many records have a gap
}

// Summarize groups recs by mode and by key (the strategy, say), in the
// order they first appear, and adds a row "all" per mode when it has more
// than one group.
func Summarize(recs []Record, key func(Record) string) []Row {
	type group struct {
		mode, key string
		recs      []Record
	}
	var groups []*group
	find := func(mode, k string) *group {
		for _, g := range groups {
			if g.mode == mode && g.key == k {
				return g
			}
		}
		g := &group{mode: mode, key: k}
		groups = append(groups, g)
		return g
	}
	perMode := map[string][]Record{}
	var modes []string
	for _, r := range recs {
		g := find(r.Mode, key(r))
		g.recs = append(g.recs, r)
		if _, ok := perMode[r.Mode]; !ok {
			modes = append(modes, r.Mode)
		}
		perMode[r.Mode] = append(perMode[r.Mode], r)
	}
	var rows []Row
	for _, m := range modes {
		n := 0
		for _, g := range groups {
			if g.mode == m {
				rows = append(rows, summarize(m, g.key, g.recs))
				n++
			}
		}
		if n > 1 {
			rows = append(rows, summarize(m, "all", perMode[m]))
		}
	}
	return rows
}

// ByStrategy and ByFault are keys for Summarize.
func ByStrategy(r Record) string { return r.Strategy }

// ByFault keys a record by its fault, "none" for none.
func ByFault(r Record) string {
	if r.Fault == "" {
		return "none"
	}
	return r.Fault
}

func summarize(mode, key string, recs []Record) Row {
	row := Row{Mode: mode, Key: key, Migrations: len(recs)}
	var totals, downs, gaps []float64
	for _, r := range recs {
		switch r.Result {
		case Completed:
			row.Completed++
		case RolledBack:
			row.RolledBack++
		default:
			row.Failed++
		}
		switch r.Outcome {
		case Exact:
			row.Exact++
		case Lost:
			row.Lost++
		case Doubled:
			row.Doubled++
		default:
			row.Stuck++
		}
		if r.Result == Completed && r.Outcome == Exact {
			totals = append(totals, r.TotalMS)
			if r.DowntimeMS > 0 {
				downs = append(downs, r.DowntimeMS)
			}
		}
		if r.GapMS != nil {
			gaps = append(gaps, *r.GapMS)
		}
	}
	row.TotalP50, row.TotalP95 = Percentile(totals, 50), Percentile(totals, 95)
	row.DowntimeP50, row.DowntimeP95 = Percentile(downs, 50), Percentile(downs, 95)
	row.GapP50, row.GapP95 = Percentile(gaps, 50), Percentile(gaps, 95)
	row.Gaps = len(gaps)
	return row
}

// Percentile is the p-th percentile of xs by the nearest rank: the
// smallest value that at least p% of xs are at or below. NaN for none.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// WriteMarkdown writes rows as a Markdown table; keyName heads the key
// column. Totals and downtimes are of the completed, exact migrations.
func WriteMarkdown(w io.Writer, keyName string, rows []Row) error {
	var b strings.Builder
	fmt.Fprintf(&b, "| mode | %s | migrations | completed | rolled back | failed | exact | lost | doubled | stuck | total p50 / p95 (s) | downtime p50 / p95 (s) | gap p50 / p95 (ms) |\n", keyName)
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rows {
		key := r.Key
		if key == "all" {
			key = "**all**"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %d | %s | %s | %s |\n", r.Mode, key, r.Migrations,
			r.Completed, r.RolledBack, r.Failed, r.Exact, r.Lost, r.Doubled, r.Stuck,
			pair(r.TotalP50/1000, r.TotalP95/1000, "%.1f"), pair(r.DowntimeP50/1000, r.DowntimeP95/1000, "%.2f"), pair(r.GapP50, r.GapP95, "%.0f"))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func pair(a, b float64, format string) string {
	if math.IsNaN(a) {
		return "–"
	}
	return fmt.Sprintf(format+" / "+format, a, b)
}
