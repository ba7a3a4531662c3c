package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ms2m/ms2m/internal/shadowqueue"
)

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
	// The stream client's own lines are teardown noise here; what fails
	// comes back as an error.
	shadowqueue.RouteClientLogs(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal the demo cleans up; a second one kills it.
		<-ctx.Done()
		stop()
	}()
	err = run(ctx, o, os.Stdout)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "demo: interrupted:", err)
		os.Exit(130)
	default:
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
