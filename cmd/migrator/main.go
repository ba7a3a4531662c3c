// Command migrator moves stateful message consumers between Kubernetes
// nodes: `migrator migrate` runs one migration, `migrator agent` is the
// node agent. See internal/migratorcli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ms2m/ms2m/internal/migratorcli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := migratorcli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
