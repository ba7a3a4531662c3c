package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
)

// migration is one row of the demo: a strategy, the kind of workload it
// moves, and the consumer's broker.
type migration struct {
	strategy contract.Strategy
	kind     lab.Kind
	// nats: the Go NATS sample consumer (a pull consumer of a JetStream
	// stream) instead of the AMQP one.
	nats bool
}

// migrations are the ones the demo runs, in order: each strategy on the
// kind of workload it is for, with the AMQP consumer, then ms2m with the
// NATS one.
var migrations = []migration{
	{strategy: contract.StrategyStopAndCopy, kind: lab.Deployment},
	{strategy: contract.StrategyMS2M, kind: lab.Deployment},
	{strategy: contract.StrategyMS2MCutoff, kind: lab.Deployment},
	{strategy: contract.StrategyStatefulSet, kind: lab.StatefulSet},
	{strategy: contract.StrategyStatefulSetShadow, kind: lab.StatefulSet},
	{strategy: contract.StrategyMS2M, kind: lab.Deployment, nats: true},
}

// upTimeout bounds bringing the cluster up, including the wait for another
// ms2m cluster to give up the network.
const upTimeout = 30 * time.Minute

// run is the whole demo: the cluster, the migrations, the table, and the
// teardown, which also runs on failure and when ctx ends.
func run(ctx context.Context, o options, out io.Writer) (err error) {
	say := newClock(out).say
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	mu := "unbounded"
	if o.mu() > 0 {
		mu = fmt.Sprintf("%.3g/s", o.mu())
	}
	say("ms2m demo: %d messages per migration at λ = %g msg/s, %v of work per message (μ = %s); each migration starts after %v of consuming",
		o.messages, o.rate, o.work, mu, o.warmup)
	if o.mu() > 0 && o.rate >= o.mu() {
		say("note: λ ≥ μ, so the queue grows while the consumer runs and the restored consumer has a backlog to work off")
	}
	if err := checkBroker(); err != nil {
		return err
	}
	if err := checkNATS(); err != nil {
		return err
	}
	say("building the sample producer")
	producer, err := lab.BuildStatic(root, "examples/producer")
	if err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Dir(producer))

	opts := cluster.Options{
		Nodes:          2,
		StateDir:       o.state,
		RepoDir:        root,
		Log:            &prefixWriter{w: out, prefix: "         cluster "},
		WaitForNetwork: true,
	}
	say("bringing up a cluster of 2 real nodes in %s and pushing the images (if another ms2m cluster holds the network, this waits until it is gone)", o.state)
	upCtx, cancel := context.WithTimeout(ctx, upTimeout)
	l, err := lab.Start(upCtx, opts)
	cancel()
	if pe := (*cluster.PreconditionError)(nil); errors.As(err, &pe) {
		return fmt.Errorf("%w\n`make demo` (as root) builds and installs all of these first", err)
	}
	defer func() {
		if o.keep && l != nil && l.Cluster != nil {
			// The webhook ends with the demo; its registration, with
			// failurePolicy Fail, would refuse every pod after it.
			if werr := l.StopWebhook(); werr != nil {
				err = errors.Join(err, werr)
			}
			say("-keep: the cluster stays up; to use it and then take it down:\n\n  export KUBECONFIG=%s\n  kubectl get pods -o wide    # any kubectl: the restored consumers run on %s\n  go run ./hack/cluster down -state %s\n",
				l.Cluster.Kubeconfig(), cluster.NodeName(2), o.state)
			return
		}
		say("taking the cluster down")
		down := func() error { return cluster.Down(opts) } // what a failed up left
		if l != nil {
			down = l.Down
		}
		if derr := down(); derr != nil {
			err = errors.Join(err, fmt.Errorf("cluster down: %w; try again with: go run ./hack/cluster down -state %s", derr, o.state))
			return
		}
		say("cluster down")
	}()
	if err != nil {
		return fmt.Errorf("bring up the cluster in %s: %w", o.state, err)
	}
	say("cluster ready; starting the admission webhook, which injects the sidecar and turns a StatefulSet's recreated pod into a restore")
	if _, err := l.StartWebhook(ctx); err != nil {
		return err
	}

	var results []result
	for _, m := range migrations {
		results = append(results, migrateOnce(ctx, l, o, m, producer, say))
		if ctx.Err() != nil {
			break
		}
	}
	fmt.Fprintln(out)
	writeTable(out, results)
	fmt.Fprintln(out, "(DOWNTIME is the processing gap: the longest time during the migration in which no consumer (source, shadow or target) finished\n"+
		" a message while one was waiting, from their journals; it includes the checkpoint's freeze and the one message's own work. SWITCH is\n"+
		" the migrator's figure: the source's stop to the target's consume of the primary queue. HASH OK: the restored consumer's count and\n"+
		" full SHA-256 chain are the producer's, with no redelivery skipped. LOST and DUPLICATED are derived from its count, last message and\n"+
		" hash chain, assuming one gap or one repeated run; \"≥n\" is a bound from the counts where the chain cannot confirm that)")
	if line := downtimeShare(results); line != "" {
		fmt.Fprintln(out, line)
	}
	fmt.Fprintln(out)
	return verdict(results)
}

// verdict is nil when every migration worked and ended with the producer's
// hash, and otherwise says which did not.
func verdict(results []result) error {
	var errs []error
	for _, r := range results {
		switch {
		case r.err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", r.label(), r.err))
		case !r.ok():
			errs = append(errs, fmt.Errorf("%s: MISMATCH: the restored consumer folded %d messages to hash %s (skipping %d redeliveries), the producer sent %d with hash %s",
				r.label(), r.got.Count, r.got.Hash, r.got.Skipped, r.want.Count, r.want.Hash))
		}
	}
	return errors.Join(errs...)
}

// moduleRoot is the repository: the folder with ms2m's go.mod, at or above
// the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/ms2m/ms2m\n") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no ms2m repository at or above %s: run the demo from the repository, with `make demo`", dir)
		}
	}
}

// clock prints progress lines stamped with the time since the demo began.
type clock struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func newClock(w io.Writer) *clock { return &clock{w: w, start: time.Now()} }

func (c *clock) say(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintf(c.w, "[%6.1fs] %s\n", time.Since(c.start).Seconds(), fmt.Sprintf(format, args...))
}

// prefixWriter starts every line written through it with prefix, so that
// the cluster's own progress lines stand apart from the demo's.
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	midway bool // the last write did not end a line
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var buf []byte
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		if !p.midway {
			buf = append(buf, p.prefix...)
		}
		buf = append(buf, line...)
		p.midway = !strings.HasSuffix(line, "\n")
	}
	if _, err := p.w.Write(buf); err != nil {
		return 0, err
	}
	return len(b), nil
}
