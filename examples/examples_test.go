package examples_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const python = "/usr/bin/python3"

// consumers are the two consumer implementations; start returns the command
// that runs one, given the test's build directory.
var consumers = []struct {
	name  string
	start func(t *testing.T) *exec.Cmd
}{
	{"go", func(t *testing.T) *exec.Cmd { return exec.Command(build(t, "consumer")) }},
	{"python", func(t *testing.T) *exec.Cmd {
		requirePika(t)
		script, err := filepath.Abs(filepath.Join("consumer-python", "consumer.py"))
		if err != nil {
			t.Fatal(err)
		}
		return exec.Command(python, script)
	}},
}

// TestConsumersEndWithProducerHash is the reference check: a consumer that
// processed every message once, in order, ends with the producer's hash.
// The redelivery skip is off (the default), and nothing may be skipped.
func TestConsumersEndWithProducerHash(t *testing.T) {
	url := brokerURL(t)
	for _, c := range consumers {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			queue := newQueue(t, url)
			want := runProducer(t, url, queue, 50)
			cons := startConsumer(t, c.start(t), map[string]string{
				"AMQP_URL": url, "QUEUE": queue, "WORK_MS": "1", "CONNECTION_NAME": uniqueName("ms2m-examples-consumer"),
			})
			got := cons.waitState(t, "count reaches 50", func(s consumerState) bool { return s.Count >= 50 })
			if got.Count != 50 || got.Hash != want.Hash || got.Last != "msg-50" || !got.Connected || got.SkippedRedeliveries != 0 {
				t.Errorf("state = %+v, want count 50, hash %s (the producer's), last msg-50, connected, 0 skipped redeliveries", got, want.Hash)
			}
			cons.stop(t)
		})
	}
}

// TestConsumersReconnect drops a consumer's connection while it consumes,
// with messages unacked: either the broker closes it (rabbitmqctl
// close_connection, found by the client-provided connection name) or a TCP
// proxy in front of the consumer cuts it. The consumer must come back by
// itself and still end with the producer's hash: redelivered messages that it
// had already folded are skipped. This is the one test that turns the skip
// on (SKIP_REDELIVERIES=true): it tests the skip, under the one cause it is
// for. Everywhere else it is off, so that the hash is the whole oracle.
func TestConsumersReconnect(t *testing.T) {
	url := brokerURL(t)
	const total = 200
	for _, c := range consumers {
		for _, viaProxy := range []bool{false, true} {
			name := c.name + "/broker-closes-connection"
			if viaProxy {
				name = c.name + "/proxy-cuts-tcp"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				queue := newQueue(t, url)
				connName := uniqueName("ms2m-examples-consumer")
				consumerURL := url
				var proxy *tcpProxy
				if viaProxy {
					proxy = startProxy(t, url)
					consumerURL = proxy.url
				} else if _, err := exec.LookPath("rabbitmqctl"); err != nil {
					unavailable(t, "rabbitmqctl is not in PATH: it is needed to close a consumer's connection")
				}
				// 200 messages of 50 ms each are 10 s of work, so the drop lands
				// mid-stream even on a slow machine; a prefetch of 10 leaves
				// messages unacked when it does.
				cons := startConsumer(t, c.start(t), map[string]string{
					"AMQP_URL": consumerURL, "QUEUE": queue, "WORK_MS": "50", "PREFETCH": "10", "CONNECTION_NAME": connName,
					"SKIP_REDELIVERIES": "true",
				})
				cons.waitState(t, "the consumer is connected", func(s consumerState) bool { return s.Connected })
				// Arm the drop while the queue is still empty: rabbitmqctl is slow.
				var drop func()
				if viaProxy {
					drop = proxy.cut
				} else {
					pids := brokerConnections(t, connName)
					drop = func() {
						for _, pid := range pids {
							rabbitmqctl(t, "close_connection", pid, "ms2m examples reconnect test")
						}
					}
				}
				want := runProducer(t, url, queue, total)
				cons.waitState(t, "count reaches 10", func(s consumerState) bool { return s.Count >= 10 })
				drop()
				atDrop := cons.waitState(t, "the consumer reconnects", func(s consumerState) bool { return s.Reconnects >= 1 })
				if atDrop.Count >= total {
					t.Fatalf("the consumer had processed all %d messages before its connection dropped; make the work longer", total)
				}
				got := cons.waitState(t, "count reaches "+strconv.Itoa(total), func(s consumerState) bool { return s.Count >= total })
				if got.Count != total || got.Hash != want.Hash || !got.Connected {
					t.Errorf("state = %+v, want count %d, hash %s (the producer's), connected", got, total, want.Hash)
				}
				t.Logf("reconnected at count %d; skipped %d redelivered messages", atDrop.Count, got.SkippedRedeliveries)
				cons.stop(t)
			})
		}
	}
}

// unavailable skips the test when a dependency is missing, or fails it in CI.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s. Run `make test`, which provides the test dependencies.", msg)
	}
	t.Skipf("SKIPPING INTEGRATION TEST: %s. Set CI=true to make this a failure.", msg)
}

// brokerURL returns the broker to test against (AMQP_URL, or the local
// default) after checking that it is reachable. -short skips the test.
func brokerURL(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs RabbitMQ; skipped with -short")
	}
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		unavailable(t, "RabbitMQ is unreachable (%v)", err)
	}
	conn.Close()
	return url
}

func requirePika(t *testing.T) {
	t.Helper()
	if out, err := exec.Command(python, "-c", "import pika").CombinedOutput(); err != nil {
		unavailable(t, "%s cannot import pika (%v: %s); install it with `apt-get install -y python3-pika`",
			python, err, bytes.TrimSpace(out))
	}
}

func uniqueName(prefix string) string {
	return prefix + "-" + strings.ToLower(rand.Text()[:8])
}

// newQueue returns a fresh queue name and deletes the queue when the test ends.
func newQueue(t *testing.T, url string) string {
	t.Helper()
	name := uniqueName("ms2m-examples-" + strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()))
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Errorf("delete queue %s: %v", name, err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(name, false, false, false)
		}
		if err != nil {
			t.Errorf("delete queue %s: %v", name, err)
		}
	})
	return name
}

// build compiles the main package in dir into the test's temp dir.
func build(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), dir)
	if out, err := exec.Command("go", "build", "-o", bin, "./"+dir).CombinedOutput(); err != nil {
		t.Fatalf("go build ./%s: %v\n%s", dir, err, out)
	}
	return bin
}

type producerResult struct {
	Count int    `json:"count"`
	First int    `json:"first"`
	Last  int    `json:"last"`
	Hash  string `json:"hash"`
}

// runProducer publishes count messages to queue as fast as possible.
func runProducer(t *testing.T, url, queue string, count int) producerResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, build(t, "producer"),
		"-url", url, "-queue", queue, "-count", strconv.Itoa(count), "-rate", "0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("producer: %v\n%s", err, stderr.Bytes())
	}
	var res producerResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("producer printed %q: %v", out, err)
	}
	if want := (producerResult{Count: count, First: 1, Last: count, Hash: res.Hash}); res != want || len(res.Hash) != 64 {
		t.Fatalf("producer printed %+v, want %+v with a 64-digit hash", res, want)
	}
	return res
}

type consumerState struct {
	Count               int     `json:"count"`
	Hash                string  `json:"hash"`
	Last                string  `json:"last"`
	Connected           bool    `json:"connected"`
	Reconnects          int     `json:"reconnects"`
	MaxLatencyMS        float64 `json:"max_latency_ms"`
	SkippedRedeliveries int     `json:"skipped_redeliveries"`
}

type consumer struct {
	cmd    *exec.Cmd
	addr   string
	exited chan struct{}
	err    error // of cmd.Wait, once exited is closed
}

// startConsumer runs cmd with env added to the environment and a free
// HTTP_ADDR. The process is killed when the test ends; its output is logged
// if the test failed.
func startConsumer(t *testing.T, cmd *exec.Cmd, env map[string]string) *consumer {
	t.Helper()
	c := &consumer{cmd: cmd, addr: freeAddr(t), exited: make(chan struct{})}
	cmd.Env = append(os.Environ(), "HTTP_ADDR="+c.addr)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	logPath := filepath.Join(t.TempDir(), "consumer.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd, err)
	}
	go func() {
		c.err = cmd.Wait()
		logFile.Close()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("output of %s:\n%s", cmd, out)
		}
	})
	return c
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitState polls GET /state until cond holds, for up to a minute.
func (c *consumer) waitState(t *testing.T, what string, cond func(consumerState) bool) consumerState {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last consumerState
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-c.exited:
			t.Fatalf("waiting until %s: consumer exited: %v", what, c.err)
		case <-time.After(50 * time.Millisecond):
		}
		s, err := c.state()
		if err != nil {
			lastErr = err
			continue
		}
		last = s
		if cond(s) {
			return s
		}
	}
	t.Fatalf("waiting until %s: gave up after a minute; last state %+v, last error %v", what, last, lastErr)
	return last
}

func (c *consumer) state() (consumerState, error) {
	var s consumerState
	resp, err := http.Get("http://" + c.addr + "/state")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("GET /state: %s", resp.Status)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// stop sends SIGTERM and expects a clean exit.
func (c *consumer) stop(t *testing.T) {
	t.Helper()
	if resp, err := http.Get("http://" + c.addr + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-c.exited:
		if c.err != nil {
			t.Errorf("consumer exited with %v after SIGTERM, want exit status 0", c.err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("consumer still running 15 s after SIGTERM")
	}
}

// brokerConnections returns the pids of the broker's connections that carry
// the client-provided connection name, waiting until there is one.
func brokerConnections(t *testing.T, connName string) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var pids []string
		out := rabbitmqctl(t, "list_connections", "pid", "client_properties")
		for line := range strings.Lines(out) {
			// <rabbit@host.1.2.0>	[...,{"connection_name","<connName>"}]
			if fields := strings.Fields(line); len(fields) > 1 && strings.Contains(line, `"`+connName+`"`) {
				pids = append(pids, fields[0])
			}
		}
		if len(pids) > 0 {
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("no broker connection named %q; rabbitmqctl list_connections printed:\n%s", connName, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func rabbitmqctl(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q", "-s"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(stderr.Bytes()))
		}
		t.Fatalf("rabbitmqctl %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// tcpProxy forwards TCP connections to the broker and can cut them all at
// once, as a network failure or a restarting proxy would.
type tcpProxy struct {
	url    string // the broker URL, pointed at the proxy
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
}

func startProxy(t *testing.T, brokerURL string) *tcpProxy {
	t.Helper()
	u, err := neturl.Parse(brokerURL)
	if err != nil {
		t.Fatalf("parse broker URL: %v", err)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5672")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.Host = ln.Addr().String()
	p := &tcpProxy{url: u.String(), ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
	})
	return p
}

func (p *tcpProxy) serve() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, down, up)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src) // a relay ends when either side does
			dst.Close()
			src.Close()
		}
		go pipe(up, down)
		go pipe(down, up)
	}
}

// cut closes every connection through the proxy; new ones are still accepted.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestConsumersSubscribe runs each consumer as a subscriber (EXCHANGE): it
// consumes a queue that the broker names (amq.gen-*), bound to the fanout
// exchange, and folds what is published to the exchange. This is the
// consumer that ms2m refuses to migrate (e2e TestServerNamedQueueRefused).
func TestConsumersSubscribe(t *testing.T) {
	url := brokerURL(t)
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		unavailable(t, "rabbitmqctl is not in PATH: it is needed to list the exchange's bindings")
	}
	const n = 30
	for _, c := range consumers {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			exchange := uniqueName("ms2m-examples-fanout")
			conn, err := amqp.Dial(url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := ch.ExchangeDelete(exchange, false, false); err != nil {
					t.Errorf("delete exchange %s: %v", exchange, err)
				}
			})
			cons := startConsumer(t, c.start(t), map[string]string{
				"AMQP_URL": url, "EXCHANGE": exchange, "WORK_MS": "1", "CONNECTION_NAME": uniqueName("ms2m-examples-consumer"),
			})
			cons.waitState(t, "the consumer is connected", func(s consumerState) bool { return s.Connected })
			var queue string
			for _, line := range strings.Split(rabbitmqctl(t, "list_bindings", "source_name", "destination_name"), "\n") {
				if f := strings.Fields(line); len(f) == 2 && f[0] == exchange {
					queue = f[1]
				}
			}
			if !strings.HasPrefix(queue, "amq.gen-") {
				t.Fatalf("exchange %s is bound to queue %q, want a server-named amq.gen-* queue", exchange, queue)
			}
			h := make([]byte, 32)
			for i := 1; i <= n; i++ {
				body := fmt.Appendf(nil, "msg-%d", i)
				sum := sha256.Sum256(append(h, body...))
				h = sum[:]
				if err := ch.PublishWithContext(t.Context(), exchange, "", false, false, amqp.Publishing{Body: body, MessageId: strconv.Itoa(i)}); err != nil {
					t.Fatal(err)
				}
			}
			got := cons.waitState(t, fmt.Sprintf("count reaches %d", n), func(s consumerState) bool { return s.Count >= n })
			if want := hex.EncodeToString(h); got.Count != n || got.Hash != want || got.SkippedRedeliveries != 0 {
				t.Errorf("state = %+v, want count %d, hash %s and nothing skipped", got, n, want)
			}
			cons.stop(t)
		})
	}
}
