package shadowqueue

import (
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/testenv"
)

// defaultTestStreamURI is the broker that `make test` prepares.
const defaultTestStreamURI = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"

// requireStream returns the URI of the RabbitMQ stream endpoint that the
// integration tests use (MS2M_TEST_STREAM_URI overrides it), after checking
// that it accepts connections. If it does not, the test fails under CI=true
// and is skipped, loudly, elsewhere. Under -short it is skipped.
func requireStream(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs RabbitMQ streams; skipped under -short")
	}
	testenv.Watchdog(t)
	uri := os.Getenv("MS2M_TEST_STREAM_URI")
	if uri == "" {
		uri = defaultTestStreamURI
	}
	r, err := streamResolver(uri)
	if err != nil {
		t.Fatalf("MS2M_TEST_STREAM_URI=%q: %v", uri, err)
	}
	addr := net.JoinHostPort(r.Host, strconv.Itoa(r.Port))
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		testenv.Missing(t, "the RabbitMQ stream endpoint at "+addr+" ("+err.Error()+")",
			"run `make test` (hack/setup.sh starts RabbitMQ and enables rabbitmq_stream), or `rabbitmq-server -detached && rabbitmq-plugins enable rabbitmq_stream`; set MS2M_TEST_STREAM_URI for another broker")
	}
	_ = c.Close()
	return uri
}
