package main

import (
	"flag"
	"fmt"
	"math"
	"time"
)

// options are the command line.
type options struct {
	keep     bool
	rate     float64       // λ, messages per second
	messages int           // per migration
	work     time.Duration // per message; 1/work is μ
	warmup   time.Duration // consuming before each migration starts
	state    string        // the cluster's state folder
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go run ./hack/demo [flags]   (as root; `make demo` builds what it needs first)\n\n"+
			"Brings up a local cluster of two real nodes, moves an unmodified consumer from node 1 to node 2\n"+
			"once per strategy (stop-and-copy, ms2m and ms2m-cutoff of a Deployment's pod, statefulset and\n"+
			"statefulset-shadow of a StatefulSet's), then a NATS JetStream consumer by ms2m, while a producer\n"+
			"sends, checks the restored state against the producer's, prints a table, and takes the cluster\n"+
			"down. Flags:")
		fs.PrintDefaults()
	}
	fs.BoolVar(&o.keep, "keep", false, "leave the cluster, the pods, the queues and the replay logs in place, and print how to use and remove them")
	fs.Float64Var(&o.rate, "rate", 10, "λ: messages per second the producer sends")
	fs.IntVar(&o.messages, "messages", 300, "messages the producer sends per migration")
	fs.DurationVar(&o.work, "work", 50*time.Millisecond, "the consumer's work per message (μ = 1/work)")
	fs.DurationVar(&o.warmup, "warmup", 10*time.Second, "how long the consumer runs before each migration starts")
	fs.StringVar(&o.state, "state", "/var/tmp/ms2m-demo", "the cluster's state folder")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q: every setting is a flag (see -h)", fs.Args())
	}
	return o, o.check()
}

func (o options) check() error {
	switch {
	case o.rate <= 0 || math.IsInf(o.rate, 0) || math.IsNaN(o.rate):
		return fmt.Errorf("-rate %v: want a positive number of messages per second", o.rate)
	case o.messages <= 0:
		return fmt.Errorf("-messages %d: want at least 1", o.messages)
	case o.work < 0 || o.work%time.Millisecond != 0:
		return fmt.Errorf("-work %v: want whole milliseconds, 0 or more", o.work)
	case o.warmup < 0:
		return fmt.Errorf("-warmup %v: want 0 or more", o.warmup)
	case o.state == "":
		return fmt.Errorf("-state: want a folder")
	}
	if n := o.warmupMessages(); n >= o.messages {
		return fmt.Errorf("-messages %d: the producer would be done before the migration starts (after %v at %v msg/s, about %d messages); raise -messages or lower -warmup",
			o.messages, o.warmup, o.rate, n)
	}
	return nil
}

// warmupMessages is how many messages the consumer folds before a
// migration starts: -warmup's worth at -rate, at least one.
func (o options) warmupMessages() int {
	return max(1, int(math.Round(o.rate*o.warmup.Seconds())))
}

// mu is the consumer's processing rate, messages per second (0: unbounded).
func (o options) mu() float64 {
	if o.work == 0 {
		return 0
	}
	return 1 / o.work.Seconds()
}
