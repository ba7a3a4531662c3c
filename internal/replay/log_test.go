package replay_test

import (
	"log/slog"
	"testing"
)

// testLogger logs to the test's output.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tw{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tw struct{ t *testing.T }

func (w tw) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }
