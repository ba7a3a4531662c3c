package testenv

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"
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
