package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/internal/soak"
)

// pingpongOptions are the pingpong mode's flags.
type pingpongOptions struct {
	chunkDeploy, chunkSts int
	state, nodeLock       string
}

func (o *pingpongOptions) register(fs *flag.FlagSet) {
	fs.IntVar(&o.chunkDeploy, "chunk-ms2m", 20, "pingpong: migrations of the Deployment's pod (ms2m) per chunk, one run of TestPingPong on a fresh local cluster")
	fs.IntVar(&o.chunkSts, "chunk-sts", 10, "pingpong: migrations of the StatefulSet's pod (statefulset-shadow) per chunk")
	fs.StringVar(&o.state, "state", "/var/tmp/ms2m-e2e", "pingpong: the local cluster's state folder (the e2e suite's MS2M_E2E_STATE)")
	fs.StringVar(&o.nodeLock, "node-lock", "", "pingpong: a file to hold locked (flock) while a chunk runs on the real nodes, so that nothing else brings a local cluster up meanwhile (default <state>/realnode.lock)")
}

// pingpong is the mode that runs TestPingPong (e2e/pingpong_test.go) in
// chunks on the local cluster of real nodes: each chunk is one run of the
// test binary, under the real-node lock, with the counts of the chunk; the
// test appends a record per migration itself.
type pingpong struct {
	o      pingpongOptions
	repo   string
	logs   string
	hard   context.Context
	stderr io.Writer
	bin    string // the e2e test binary, built on the first chunk
}

func newPingpong(o pingpongOptions, logs string, hard context.Context, stderr io.Writer) (*pingpong, error) {
	if o.chunkDeploy < 0 || o.chunkSts < 0 || o.chunkDeploy+o.chunkSts < 1 {
		return nil, fmt.Errorf("-chunk-ms2m %d, -chunk-sts %d: want 0 or more each, 1 or more together", o.chunkDeploy, o.chunkSts)
	}
	if o.nodeLock == "" {
		o.nodeLock = filepath.Join(o.state, "realnode.lock")
	}
	repo := cluster.FindRepo()
	if repo == "" {
		return nil, errors.New("run the soak inside the ms2m repository (it builds and runs ./e2e)")
	}
	return &pingpong{o: o, repo: repo, logs: logs, hard: hard, stderr: stderr}, nil
}

func (p *pingpong) Name() string { return "pingpong" }

// split is how a chunk of n migrations divides between the Deployment and
// the StatefulSet, in the proportion of the chunk flags.
func split(n, deploy, sts int) (d, s int) {
	s = (n*sts + (deploy+sts)/2) / (deploy + sts)
	if sts > 0 && s == 0 && n > 1 {
		s = 1
	}
	return n - s, s
}

func (p *pingpong) Chunk(ctx context.Context, c soak.Chunk) error {
	if err := os.MkdirAll(p.logs, 0o755); err != nil {
		return err
	}
	if p.bin == "" {
		bin := filepath.Join(os.TempDir(), fmt.Sprintf("ms2m-soak-e2e-%d.test", os.Getpid()))
		build := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, "./e2e/")
		build.Dir, build.Stdout, build.Stderr = p.repo, p.stderr, p.stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build the e2e tests: %w", err)
		}
		p.bin = bin
	}
	d, s := split(c.N, p.o.chunkDeploy, p.o.chunkSts)
	unlock, err := lockFile(ctx, p.o.nodeLock, p.stderr)
	if err != nil {
		return err
	}
	defer unlock()

	logPath := filepath.Join(p.logs, "pingpong-"+c.ID+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	stop := filepath.Join(p.logs, ".stop-"+c.ID)
	os.Remove(stop)
	defer os.Remove(stop)
	budget := time.Duration(10+2*c.N)*time.Minute + 10*time.Minute // the test's own budget, and its watchdog's slack
	cmd := exec.Command(p.bin, "-test.run", "^TestPingPong$", "-test.v", "-test.count=1", "-test.timeout", budget.String())
	cmd.Dir = filepath.Join(p.repo, "e2e")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(),
		"CI=true", // a soak that skipped would prove nothing
		"MS2M_E2E_STATE="+p.o.state,
		"MS2M_E2E_PINGPONG="+strconv.Itoa(d),
		"MS2M_E2E_PINGPONG_STS="+strconv.Itoa(s),
		"MS2M_SOAK_RECORDS="+c.Records,
		"MS2M_SOAK_FIRST="+strconv.Itoa(c.First),
		"MS2M_SOAK_RUN="+c.ID,
		"MS2M_SOAK_STOP="+stop,
	)
	fmt.Fprintf(p.stderr, "%s soak: pingpong: %d ms2m and %d statefulset-shadow migrations on the real nodes; log %s\n", time.Now().Format("15:04:05"), d, s, logPath)
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// Soft: the test stops after the migration under way, checks the
		// consumer and cleans up.
		if err := os.WriteFile(stop, nil, 0o644); err != nil {
			fmt.Fprintf(p.stderr, "soak: ask the test to stop: %v\n", err)
		}
		select {
		case err = <-done:
		case <-p.hard.Done():
			if kerr := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); kerr != nil { // the test and what it started in its group
				fmt.Fprintf(p.stderr, "soak: kill the test: %v\n", kerr)
			}
			err = <-done
			if derr := cluster.Down(cluster.Options{StateDir: p.o.state, Log: logFile}); derr != nil {
				err = errors.Join(err, fmt.Errorf("take the cluster down: %w", derr))
			}
		}
	}
	if err != nil {
		kept := filepath.Join(p.logs, "pingpong-"+c.ID+"-cluster")
		if cerr := keepLogs(filepath.Join(p.o.state, "logs"), kept); cerr != nil {
			fmt.Fprintf(p.stderr, "soak: keep the cluster's logs: %v\n", cerr)
		}
		return fmt.Errorf("TestPingPong: %w (its log: %s; the cluster's, the controller's included: %s)", err, logPath, kept)
	}
	return nil
}

// keepLogs copies the *.log files of the local cluster's log folder to
// dst: the next chunk's cluster starts with an empty one, and a failed
// chunk's controller log is what says why.
func keepLogs(src, dst string) error {
	logs, err := filepath.Glob(filepath.Join(src, "*.log"))
	if err != nil || len(logs) == 0 {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err == nil {
			err = os.WriteFile(filepath.Join(dst, filepath.Base(l)), b, 0o644)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// lockFile takes an exclusive flock on path, waiting in the kernel's
// queue as long as another process holds it (or until ctx ends), and
// returns its release.
func lockFile(ctx context.Context, path string, say io.Writer) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		return func() { f.Close() }, nil
	}
	fmt.Fprintf(say, "%s soak: waiting for the real-node lock %s\n", time.Now().Format("15:04:05"), path)
	got := make(chan error, 1)
	go func() { got <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }() // blocks until it is ours
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		return func() { f.Close() }, nil
	case <-ctx.Done():
		go func() {
			if err := <-got; err != nil {
				fmt.Fprintf(say, "soak: lock %s: %v\n", path, err)
			}
			_ = f.Close() // released as soon as it comes; nothing was written
		}()
		return nil, ctx.Err()
	}
}
