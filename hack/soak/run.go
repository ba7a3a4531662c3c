package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ms2m/ms2m/internal/soak"
)

const usage = `usage:
  go run ./hack/soak [flags]               run a soak (make soak SOAKFLAGS='...')
  go run ./hack/soak summary -in DIR       the table of the records in DIR

A soak migrates again and again, checks every migration, and appends one JSON
record per migration to DIR/<mode>.jsonl. It is safe to stop (Ctrl-C: after
the migration under way; twice: at once) and resumes where it stopped: run the
same command again. docs/soak.md. Flags:
`

// run is the command line: a soak, or the summary subcommand.
func run(soft, hard context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "summary" {
		return summary(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
	mode := fs.String("mode", "pingpong", "what to soak: pingpong (real nodes: TestPingPong's migrations by annotation, back and forth) or sim (the simulated cluster: randomized migrations with faults)")
	out := fs.String("out", "out/soak", "the output folder: <mode>.jsonl, and logs/")
	count := fs.Int("count", 30, "how many migrations the mode's file is to hold; a run goes on from what it holds")
	seed := fs.Int64("seed", 1, "the seed of the sim mode's draws (migration i draws from seed and i, so a resumed run draws as an unbroken one)")
	tries := fs.Int("tries", 3, "chunks in a row that may record nothing before the soak gives up")
	var pp pingpongOptions
	pp.register(fs)
	var so simOptions
	so.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: every setting is a flag (-h)", fs.Args())
	}
	logs := filepath.Join(*out, "logs")
	var m soak.Mode
	var chunk int
	switch *mode {
	case "pingpong":
		p, err := newPingpong(pp, logs, hard, stderr)
		if err != nil {
			return err
		}
		m, chunk = p, pp.chunkDeploy+pp.chunkSts
	case "sim":
		s, err := newSim(so, logs, hard, stderr)
		if err != nil {
			return err
		}
		defer s.Close()
		m, chunk = s, so.chunk
	default:
		return fmt.Errorf("-mode %q: want pingpong or sim", *mode)
	}
	f, err := soak.Open(*out, m.Name())
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return err
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(stderr, "%s soak: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	err = soak.Run(soft, f, m, soak.Options{Count: *count, ChunkSize: chunk, Seed: *seed, Tries: *tries, Logf: logf})
	if recs, rerr := soak.ReadDir(*out); rerr == nil {
		var mine []soak.Record
		for _, r := range recs {
			if r.Mode == m.Name() {
				mine = append(mine, r)
			}
		}
		if len(mine) > 0 {
			fmt.Fprintln(stdout)
			err = errors.Join(err, soak.WriteMarkdown(stdout, "strategy", soak.Summarize(mine, soak.ByStrategy)))
		}
	}
	return err
}

// summary is the summary subcommand: the records of a folder as Markdown
// tables, by strategy and by fault.
func summary(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("soak summary", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", "out/soak", "the soak's output folder")
	modes := fs.String("modes", "", "comma-separated modes to summarise (default: all)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	recs, err := soak.ReadDir(*in)
	if err != nil {
		return err
	}
	if *modes != "" {
		want := strings.Split(*modes, ",")
		var keep []soak.Record
		for _, r := range recs {
			for _, w := range want {
				if r.Mode == strings.TrimSpace(w) {
					keep = append(keep, r)
				}
			}
		}
		recs = keep
	}
	if err := soak.WriteMarkdown(stdout, "strategy", soak.Summarize(recs, soak.ByStrategy)); err != nil {
		return err
	}
	faulted := false
	for _, r := range recs {
		faulted = faulted || r.Fault != ""
	}
	if !faulted {
		return nil
	}
	fmt.Fprintln(stdout)
	return soak.WriteMarkdown(stdout, "fault", soak.Summarize(recs, soak.ByFault))
}
