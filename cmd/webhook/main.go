// Command webhook is the ms2m mutating admission webhook: it injects the
// sidecar into pods that opted in and turns migration targets into
// restores. It is configured by environment variables; see docs/webhook.md.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/ms2m/ms2m/internal/webhook"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "webhook:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := webhook.LoadConfig()
	if err != nil {
		return err
	}
	level, _ := cfg.Level()
	log := logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctrl.SetLogger(log)
	klog.SetLogger(log)
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("reach the API server (in-cluster, or KUBECONFIG): %w", err)
	}
	return webhook.Run(ctx, cfg, restCfg, log)
}
