package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Broker is the RabbitMQ the tests use.
type Broker struct {
	AMQPURL   string // amqp://guest:guest@127.0.0.1:5672/
	AMQPAddr  string // 127.0.0.1:5672
	StreamURI string // rabbitmq-stream://guest:guest@127.0.0.1:5552/
}

// Missing fails t under CI=true and skips it elsewhere, saying what is
// missing and how to get it.
func Missing(t testing.TB, what, how string) {
	t.Helper()
	msg := fmt.Sprintf("\n*** MISSING: %s ***\n*** %s ***", what, how)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg + "\n*** skipping (this fails under CI=true) ***")
}

// RequireBroker returns the broker, after checking that its AMQP and stream
// ports answer. MS2M_TEST_AMQP_ADDR and MS2M_TEST_STREAM_ADDR override the
// addresses.
//
// It also arms a Watchdog for t: every broker test is an integration test
// that must end by itself.
func RequireBroker(t testing.TB) Broker {
	t.Helper()
	Watchdog(t)
	amqpAddr := envOr("MS2M_TEST_AMQP_ADDR", "127.0.0.1:5672")
	streamAddr := envOr("MS2M_TEST_STREAM_ADDR", "127.0.0.1:5552")
	for _, a := range []string{amqpAddr, streamAddr} {
		c, err := net.DialTimeout("tcp", a, 2*time.Second)
		if err != nil {
			Missing(t, "RabbitMQ at "+a+" ("+err.Error()+")", "run `make test` (hack/setup.sh starts RabbitMQ and enables rabbitmq_stream), or `rabbitmq-server -detached && rabbitmq-plugins enable rabbitmq_stream`")
		}
		c.Close()
	}
	return Broker{
		AMQPURL:   "amqp://guest:guest@" + amqpAddr + "/",
		AMQPAddr:  amqpAddr,
		StreamURI: "rabbitmq-stream://guest:guest@" + streamAddr + "/",
	}
}

// RequirePika checks that Debian's python3 has pika and returns its path.
func RequirePika(t testing.TB) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import pika").Run(); err != nil {
		Missing(t, "python3-pika for /usr/bin/python3", "run `make test` (it installs it), or apt-get install python3-pika")
	}
	return py
}

// UniqueName returns prefix with a random suffix, for queues and logs.
func UniqueName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

var (
	buildMu  sync.Mutex
	builtDir string
	built    = map[string]string{}
)

// Build compiles the main package at pkg (a path relative to the module
// root, like "examples/consumer") once per test binary and returns the
// binary's path.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	if builtDir == "" {
		d, err := os.MkdirTemp("", "ms2m-testbin-") //nolint:usetesting // shared by every test of the binary; t.TempDir would vanish with the first test
		if err != nil {
			t.Fatal(err)
		}
		builtDir = d
	}
	out := filepath.Join(builtDir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, "./"+pkg)
	cmd.Dir = ModuleRoot(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, b)
	}
	built[pkg] = out
	return out
}

// ModuleRoot is the repository's root folder.
func ModuleRoot(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// FreeAddr returns a loopback address with a port that was free a moment
// ago, for a process the test starts to listen on. The port lies below
// the kernel's ephemeral range (ip_local_port_range): a port from that
// range, free when asked for, is handed to the next outgoing connection or
// bind to port 0 of any process on the machine, and a Python consumer that
// takes seconds to start on a loaded machine then fails to bind it (or the
// test reads another process's state there). Below the range only another
// FreeAddr can pick it, and one process never picks a port twice.
func FreeAddr(t testing.TB) string {
	t.Helper()
	lo, hi := freePortRange()
	freePortsMu.Lock()
	defer freePortsMu.Unlock()
	for range 1000 {
		var b [2]byte
		if _, err := rand.Read(b[:]); err != nil {
			t.Fatal(err)
		}
		port := lo + (int(b[0])<<8|int(b[1]))%(hi-lo)
		if freePortsGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", fmt.Sprint(port)))
		if err != nil {
			continue // in use
		}
		_ = l.Close()
		freePortsGiven[port] = true
		return l.Addr().String()
	}
	t.Fatalf("no free loopback port in %d..%d", lo, hi-1)
	return ""
}

var (
	freePortsMu    sync.Mutex
	freePortsGiven = map[int]bool{}
)

// freePortRange is where FreeAddr picks ports: [lo, hi), the 12,768
// ports below the start of the kernel's ephemeral range (32768 unless
// ip_local_port_range says otherwise), and never below 1024.
func freePortRange() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var a, z int
		if n, _ := fmt.Sscan(string(b), &a, &z); n == 2 && a > 1024+1000 {
			hi = a
		}
	}
	return max(1024, hi-12768), hi
}

// Eventually polls cond every 20 ms until it is true or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// TLSBroker is the same RabbitMQ's TLS listeners and the test CA that
// hack/setup.sh made for them.
type TLSBroker struct {
	AMQPAddr   string // 127.0.0.1:5671
	StreamAddr string // 127.0.0.1:5551
	CAFile     string // the test CA
	// ClientCert and ClientKey are a client certificate whose CN is
	// ClientUser, a broker user that logs in by EXTERNAL.
	ClientCert, ClientKey, ClientUser string
}

// RequireTLSBroker returns the broker's TLS listeners, after checking that
// they answer and that the CA files are there. MS2M_STATE_DIR is where
// hack/setup.sh keeps them (default /var/lib/ms2m).
func RequireTLSBroker(t testing.TB) TLSBroker {
	t.Helper()
	Watchdog(t)
	dir := filepath.Join(envOr("MS2M_STATE_DIR", "/var/lib/ms2m"), "tls")
	b := TLSBroker{
		AMQPAddr: "127.0.0.1:5671", StreamAddr: "127.0.0.1:5551",
		CAFile:     filepath.Join(dir, "ca.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client.key"),
		ClientUser: "ms2m-tls-client",
	}
	const how = "run `make test` or `bash hack/setup.sh` (it starts the broker's TLS listeners with a test CA, without a restart)"
	for _, f := range []string{b.CAFile, b.ClientCert, b.ClientKey} {
		if _, err := os.Stat(f); err != nil {
			Missing(t, "the test CA file "+f, how)
		}
	}
	for _, a := range []string{b.AMQPAddr, b.StreamAddr} {
		c, err := net.DialTimeout("tcp", a, 2*time.Second)
		if err != nil {
			Missing(t, "RabbitMQ's TLS listener at "+a+" ("+err.Error()+")", how)
		}
		c.Close()
	}
	return b
}

// SpringJarPath is the Spring Boot sample consumer's jar, relative to the
// module root, where `make consumer-spring` builds it.
const SpringJarPath = "examples/consumer-spring/target/consumer-spring.jar"

// SpringJVMFlags are the JVM options the tests run the Spring consumer
// with: a small heap and the serial collector (fewer threads and pages, for
// a loaded 2-core machine and for CRIU), no hsperfdata file in /tmp, and the
// C1 compiler only, which starts faster.
var SpringJVMFlags = []string{"-XX:+UseSerialGC", "-Xmx128m", "-XX:-UsePerfData", "-XX:TieredStopAtLevel=1"}

var springMu sync.Mutex

// RequireSpringJar brings the Spring consumer's jar up to date with `make
// consumer-spring` (nothing when it is; one Maven build at a time across
// test binaries, by a lock file) and returns its path and the java to run
// it with. A missing Maven, java or failed build fails under CI=true and
// skips elsewhere.
func RequireSpringJar(t testing.TB) (java, jar string) {
	t.Helper()
	java, err := exec.LookPath("java")
	if err != nil {
		Missing(t, "java (a JRE 17)", "run `make setup` (it installs openjdk-17-jdk-headless and maven)")
	}
	springMu.Lock()
	defer springMu.Unlock()
	root := ModuleRoot(t)
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "ms2m-consumer-spring.lock"), os.O_CREATE|os.O_RDWR, 0o644) //nolint:usetesting // one Maven build at a time across test processes takes a path they all know
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) // closing the file releases it too
	cmd := exec.Command("make", "-s", "--no-print-directory", "consumer-spring")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	jar = filepath.Join(root, SpringJarPath)
	if _, statErr := os.Stat(jar); err != nil || statErr != nil {
		Missing(t, fmt.Sprintf("the Spring consumer's jar %s (make consumer-spring: %v, %v)\n%s", jar, err, statErr, out),
			"run `make setup consumer-spring`; the Maven build needs a JDK 17, Maven and, once, Maven Central")
	}
	return java, jar
}
