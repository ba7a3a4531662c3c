package testenv

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// StuckAfter is how long one integration test may run before Watchdog gives
// up on it. The slowest test takes about 15 s; MS2M_TEST_STUCK_AFTER
// overrides it (a Go duration).
const StuckAfter = 3 * time.Minute

// Watchdog ends the test binary if t runs (cleanups included) for longer
// than StuckAfter. A hang would otherwise run into go test's package
// timeout, whose report ends with a goroutine dump and hides which test hung;
// this one writes the full dump to a file, prints the stacks of this
// module's goroutines, and ends with the stuck test's name.
func Watchdog(t testing.TB) {
	d := StuckAfter
	if v := os.Getenv("MS2M_TEST_STUCK_AFTER"); v != "" {
		if p, err := time.ParseDuration(v); err == nil && p > 0 {
			d = p
		}
	}
	WatchdogFor(t, d)
}

// armed holds the tests that have a watchdog.
var armed sync.Map

// WatchdogFor is Watchdog with a budget of d, for tests that take long by
// design (the end-to-end migrations). The first watchdog armed for a test
// is the one that counts.
func WatchdogFor(t testing.TB, d time.Duration) {
	if _, loaded := armed.LoadOrStore(t, true); loaded {
		return
	}
	name := t.Name()
	timer := time.AfterFunc(d, func() { stuck(name, d) })
	t.Cleanup(func() { timer.Stop(); armed.Delete(t) })
}

func stuck(name string, d time.Duration) {
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	file := filepath.Join(os.TempDir(), "ms2m-stuck-"+strings.NewReplacer("/", "_", " ", "_").Replace(name)+".txt")
	if err := os.WriteFile(file, buf, 0o644); err != nil {
		file = "(not written: " + err.Error() + ")"
	}
	var ours bytes.Buffer
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("github.com/ms2m/ms2m/")) {
			ours.Write(g)
			ours.WriteString("\n\n")
		}
	}
	fmt.Fprintf(os.Stderr, "\n%s\n*** ms2m: test %s is STUCK: still running after %s ***\n*** the goroutines of this module are above; the full dump is in %s ***\n", ours.String(), name, d, file)
	os.Exit(3)
}
