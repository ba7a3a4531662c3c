package testenv

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATS is the NATS server (with JetStream) the tests use.
type NATS struct {
	URL  string // nats://127.0.0.1:4222
	Addr string // 127.0.0.1:4222
}

// RequireNATS returns the NATS server, after checking that it answers with
// an INFO that says JetStream is on. MS2M_TEST_NATS_ADDR overrides the
// address. It arms a Watchdog for t, as RequireBroker does.
func RequireNATS(t testing.TB) NATS {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a NATS server; skipped under -short")
	}
	Watchdog(t)
	addr := envOr("MS2M_TEST_NATS_ADDR", "127.0.0.1:4222")
	how := "run `make setup` (hack/setup.sh installs Debian's nats-server and starts it with -js), or `nats-server -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server`"
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		Missing(t, "a NATS server at "+addr+" ("+err.Error()+")", how)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "INFO ") {
		Missing(t, "a NATS server at "+addr+" (no INFO)", how)
	}
	if !strings.Contains(line, `"jetstream":true`) {
		Missing(t, "JetStream on the NATS server at "+addr, "start nats-server with -js")
	}
	return NATS{URL: "nats://" + addr, Addr: addr}
}

// NATSClients are the languages of the sample NATS consumers, which fold the
// same hash chain and serve the same /state: examples/consumer-nats (Go,
// nats.go), examples/consumer-nats-python (nats-py) and
// examples/consumer-nats-node (nats.js).
var NATSClients = []string{"go", "python", "node"}

var natsClientMu sync.Mutex

// NATSConsumer returns the command line of the sample NATS consumer in lang
// (one of NATSClients). For python and node it first brings the client
// library up to date with `make consumer-nats-python` or `make
// consumer-nats-node` (nothing when it is; one install at a time across test
// binaries, by a lock file). A missing interpreter or a failed install fails
// under CI=true and skips elsewhere.
func NATSConsumer(t testing.TB, lang string) []string {
	t.Helper()
	root := ModuleRoot(t)
	var interp, script, stamp string
	switch lang {
	case "go":
		return []string{Build(t, "examples/consumer-nats")}
	case "python":
		interp, script = "/usr/bin/python3", filepath.Join(root, "examples/consumer-nats-python/consumer.py")
		stamp = "examples/consumer-nats-python/pylib/.installed-nats-py-*"
	case "node":
		p, err := exec.LookPath("node")
		if err != nil {
			Missing(t, "node (Node.js 18 or later)", "as root: apt-get install nodejs npm")
		}
		interp, script = p, filepath.Join(root, "examples/consumer-nats-node/consumer.js")
		stamp = "examples/consumer-nats-node/node_modules/.ms2m-installed"
	default:
		t.Fatalf("no sample NATS consumer in %q", lang)
	}
	natsClientMu.Lock()
	defer natsClientMu.Unlock()
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "ms2m-consumer-nats.lock"), os.O_CREATE|os.O_RDWR, 0o644) //nolint:usetesting // one install at a time across test processes takes a path they all know
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) // closing the file releases it too
	target := "consumer-nats-" + lang
	cmd := exec.Command("make", "-s", "--no-print-directory", target)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if m, _ := filepath.Glob(filepath.Join(root, stamp)); err != nil || len(m) == 0 {
		Missing(t, fmt.Sprintf("the %s NATS client of %s (make %s: %v)\n%s", lang, script, target, err, out),
			"run `make "+target+"`; it needs, once, the package registry")
	}
	return []string{interp, script}
}

// ConnectJetStream connects a nats.go client to url with opts, closed when
// t ends, and returns it with its JetStream context.
func ConnectJetStream(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}
