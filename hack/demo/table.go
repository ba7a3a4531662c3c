package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/ms2m/ms2m/internal/contract"
)

// writeTable prints one row per migration (the strategy, with "(NATS)"
// after it for the NATS consumer): its times (DOWNTIME is the
// processing gap, "?" when the journals could not give it; SWITCH the
// migrator's switch time), the messages lost and duplicated (tallyOf; "≥n"
// where the hash chain cannot confirm them), and whether the restored
// consumer's count and full hash are the producer's with nothing skipped.
func writeTable(w io.Writer, results []result) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STRATEGY\tTOTAL\tDOWNTIME\tSWITCH\tLOST\tDUPLICATED\tHASH OK")
	for _, r := range results {
		if r.err != nil {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\tFAILED\n", r.label(), ms(r.report.Total))
			continue
		}
		ok := "yes"
		if !r.ok() {
			ok = "NO"
		}
		gap := "?"
		if r.gapErr == nil {
			gap = ms(r.gap.Duration())
		}
		lost, dup := tallyOf(r.want, r.got).cells()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.label(), ms(r.report.Total), gap, ms(r.report.Downtime), lost, dup, ok)
	}
	tw.Flush()
}

// downtimeShare is the line that compares ms2m's downtime (its processing
// gap) with stop-and-copy's, both with the AMQP consumer, or "" unless both
// migrations worked and have one.
func downtimeShare(results []result) string {
	var m, sc *result
	for i := range results {
		r := &results[i]
		if r.nats || r.err != nil || r.gapErr != nil || r.gap.Duration() <= 0 {
			continue
		}
		switch r.strategy {
		case contract.StrategyMS2M:
			m = r
		case contract.StrategyStopAndCopy:
			sc = r
		}
	}
	if m == nil || sc == nil {
		return ""
	}
	gm, gs := m.gap.Duration(), sc.gap.Duration()
	return fmt.Sprintf("ms2m's downtime (processing gap) is %.1f%% of stop-and-copy's (%s against %s); its switch time %s against %s",
		100*gm.Seconds()/gs.Seconds(), ms(gm), ms(gs), ms(m.report.Downtime), ms(sc.report.Downtime))
}

// ms rounds d to the millisecond for printing.
func ms(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.Round(time.Millisecond).String()
}
