package shadowqueue

import (
	"fmt"
	"log/slog"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/logs"
)

// RouteClientLogs sends the stream client library's own log lines, which it
// otherwise prints to stdout, to l. Its errors are mostly connection
// teardown noise, and every failure that matters comes back from a call,
// so they are logged at info and the rest at debug. The setting is
// process-wide: call it once, from main, before any stream connection.
func RouteClientLogs(l *slog.Logger) {
	logs.SetLogger(clientLogger{l.With("component", "stream-client")})
}

type clientLogger struct{ l *slog.Logger }

func (c clientLogger) Info(m string, v ...any)  { c.l.Debug(fmt.Sprintf(m, v...)) }
func (c clientLogger) Debug(m string, v ...any) { c.l.Debug(fmt.Sprintf(m, v...)) }
func (c clientLogger) Warn(m string, v ...any)  { c.l.Debug(fmt.Sprintf(m, v...)) }
func (c clientLogger) Error(m string, v ...any) { c.l.Info(fmt.Sprintf(m, v...)) }
