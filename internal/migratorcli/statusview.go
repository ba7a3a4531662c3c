package migratorcli

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/migrate"
)

// record is one migration the cluster knows of: its Status, or why that
// could not be read, and where it was found. This file turns records into
// text and JSON, without I/O; status.go finds them.
type record struct {
	Namespace string
	Pod       string // the pod the record is about
	From      string // where it was read, e.g. "annotation ms2m.io/migration-status"
	Status    controller.Status
	Err       error // the record is there but could not be read
}

// messageWidth bounds MESSAGE in the table; the detail view has it all.
const messageWidth = 60

var tableHeader = []string{"NAMESPACE", "POD", "MIGRATION", "STRATEGY", "PHASE", "TARGET NODE", "TARGET POD", "TOTAL", "DOWNTIME", "AGE", "HISTORY", "MESSAGE"}

// sortRecords orders records by namespace, then pod.
func sortRecords(recs []record) {
	sort.SliceStable(recs, func(i, j int) bool {
		if recs[i].Namespace != recs[j].Namespace {
			return recs[i].Namespace < recs[j].Namespace
		}
		return recs[i].Pod < recs[j].Pod
	})
}

// row is a record as the table's cells, at time now.
func row(rec record, now time.Time) []string {
	if rec.Err != nil {
		return []string{rec.Namespace, rec.Pod, "-", "-", "Invalid", "-", "-", "-", "-", "-", "-", truncate("unreadable " + rec.From + " (see below)")}
	}
	st := rec.Status
	total, downtime := "-", "-"
	if st.Report != nil {
		total = st.Report.Total.Round(time.Millisecond).String()
		if st.Phase == contract.PhaseSucceeded {
			downtime = st.Report.Downtime.Round(time.Millisecond).String()
		}
	}
	age := "-"
	if !st.Started.IsZero() {
		age = duration.HumanDuration(now.Sub(st.Started))
	}
	return []string{rec.Namespace, rec.Pod, dash(st.Name), dash(st.Strategy), dash(string(st.Phase)), dash(st.Target), dash(st.TargetPod), total, downtime, age, dash(historyCell(st.History)), dash(truncate(st.Message))}
}

// outcomeWord is an ended request's outcome in the table's HISTORY.
var outcomeWord = map[contract.Phase]string{
	contract.PhaseSucceeded:  "ok",
	contract.PhaseFailed:     "failed",
	contract.PhaseRolledBack: "rolled-back",
}

// historyCell is the outcomes of the ended requests, newest first.
func historyCell(h []controller.Entry) string {
	words := make([]string, len(h))
	for i, e := range h {
		words[i] = outcomeWord[e.Outcome]
		if words[i] == "" {
			words[i] = string(e.Outcome)
		}
	}
	return strings.Join(words, ",")
}

// writeHistory prints the ended requests, newest first, one line each.
func writeHistory(w io.Writer, h []controller.Entry, now time.Time) error {
	if len(h) == 0 {
		return nil
	}
	fmt.Fprintf(w, "history (the last %d requests that ended, newest first)\n", controller.HistoryLen)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  STARTED\tMIGRATION\tOUTCOME\tFROM\tTO\tTOTAL\tDOWNTIME")
	for _, e := range h {
		total, downtime := "-", "-"
		if e.Total > 0 {
			total = e.Total.Round(time.Millisecond).String()
		}
		if e.Outcome == contract.PhaseSucceeded && e.Downtime > 0 {
			downtime = e.Downtime.Round(time.Millisecond).String()
		}
		started := "-"
		if !e.Started.IsZero() {
			started = duration.HumanDuration(now.Sub(e.Started)) + " ago"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", started, dash(e.Name), e.Outcome, dash(e.From), dash(e.To), total, downtime)
	}
	return tw.Flush()
}

// writeTable prints records as a table, one row each.
func writeTable(w io.Writer, recs []record, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, strings.Join(tableHeader, "\t"))
	for _, rec := range recs {
		fmt.Fprintln(tw, strings.Join(row(rec, now), "\t"))
	}
	return tw.Flush()
}

// writeDetail prints one readable record in full: its fields, each phase
// with its time as `migrator migrate` shows them, and the report.
func writeDetail(w io.Writer, rec record, now time.Time) error {
	st := rec.Status
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	line("migration", dash(st.Name))
	line("pod", rec.Namespace+"/"+rec.Pod+" (recorded in "+rec.From+")")
	line("strategy", dash(st.Strategy))
	line("phase", dash(string(st.Phase)))
	line("source node", dash(st.Source))
	line("target node", dash(st.Target))
	line("target pod", dash(st.TargetPod))
	if !st.Started.IsZero() {
		line("started", st.Started.UTC().Format(time.RFC3339)+" ("+duration.HumanDuration(now.Sub(st.Started))+" ago)")
	}
	line("message", dash(oneLine(st.Message)))
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := writeHistory(w, st.History, now); err != nil {
		return err
	}
	if st.Report == nil {
		if st.Phase == contract.PhaseRunning {
			fmt.Fprintf(w, "phases: the report comes when the migration ends; so far: kubectl events -n %s --for pod/%s\n", rec.Namespace, rec.Pod)
		}
		return nil
	}
	fmt.Fprintln(w, "phases")
	var at time.Duration
	for _, ph := range st.Report.Phases {
		at += ph.Took
		printPhase(w, ph.Name, ph.Took, at)
	}
	fmt.Fprintln(w, "report")
	return writeReportLines(w, *st.Report)
}

// printPhase prints one phase that ended: how long it took, and when since
// the migration began.
func printPhase(w io.Writer, name string, took, at time.Duration) {
	fmt.Fprintf(w, "  %-20s %10s   (at %s)\n", name, took.Round(time.Millisecond), at.Round(time.Millisecond))
}

// reportLines are a report's fields as label and value, in the order they
// are printed.
func reportLines(rep migrate.Report) [][2]string {
	lines := [][2]string{
		{"target pod", rep.TargetPod},
		{"total", rep.Total.Round(time.Millisecond).String()},
		{"downtime", rep.Downtime.Round(time.Millisecond).String()},
	}
	for _, ph := range rep.Phases {
		if ph.Name == "checkpoint" { // none was taken in a migration that failed before it
			lines = append(lines, [2]string{"checkpoint ID", fmt.Sprint(rep.Start)})
			break
		}
	}
	if rep.CutoffID != 0 {
		lines = append(lines, [2]string{"cutoff ID", fmt.Sprint(rep.CutoffID)})
	}
	if rep.TCutoff != 0 {
		lines = append(lines, [2]string{"T_cutoff", fmt.Sprintf("%s (λ %.2f/s, μ %.2f/s)", rep.TCutoff.Round(time.Millisecond), rep.Lambda, rep.Mu)})
	}
	if rep.Image != "" {
		lines = append(lines, [2]string{"image", rep.Image})
	}
	for _, u := range rep.Unchecked {
		lines = append(lines, [2]string{"not preflighted", u})
	}
	return lines
}

func writeReportLines(w io.Writer, rep migrate.Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, l := range reportLines(rep) {
		fmt.Fprintf(tw, "  %s\t%s\n", l[0], l[1])
	}
	return tw.Flush()
}

// recordJSON is a record as `migrator status -o json` prints it.
type recordJSON struct {
	Namespace string             `json:"namespace"`
	Pod       string             `json:"pod"`
	From      string             `json:"from"`
	Status    *controller.Status `json:"status,omitempty"`
	Error     string             `json:"error,omitempty"`
}

func toJSON(rec record) recordJSON {
	j := recordJSON{Namespace: rec.Namespace, Pod: rec.Pod, From: rec.From}
	if rec.Err != nil {
		j.Error = rec.Err.Error()
	} else {
		st := rec.Status
		j.Status = &st
	}
	return j
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine folds runs of white space (CRIU's errors span lines) into one
// space.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// truncate makes s one line of at most messageWidth characters.
func truncate(s string) string {
	s = oneLine(s)
	if r := []rune(s); len(r) > messageWidth {
		return string(r[:messageWidth-1]) + "…"
	}
	return s
}
