// Command sidecar is the ms2m sidecar: a transparent AMQP 0-9-1 proxy (or,
// with MS2M_BROKER=nats, a NATS proxy; see docs/nats.md) that tees every
// delivery to the app into a replay log. It is configured by environment
// variables; see docs/sidecar.md.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "sidecar:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := sidecar.LoadConfig()
	if err != nil {
		return err
	}
	level, _ := cfg.Level()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	shadowqueue.RouteClientLogs(logger)
	return sidecar.Run(ctx, cfg, logger)
}
