package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// The first SIGINT or SIGTERM stops the soak after the migration under
	// way (soft); a second one stops it at once (hard).
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	soft, stopSoft := context.WithCancel(context.Background())
	hard, stopHard := context.WithCancel(context.Background())
	go func() {
		<-sigs
		fmt.Fprintln(os.Stderr, "soak: stopping after the migration under way (again to stop at once)")
		stopSoft()
		<-sigs
		fmt.Fprintln(os.Stderr, "soak: stopping at once")
		stopHard()
	}()
	err := run(soft, hard, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case soft.Err() != nil:
		fmt.Fprintln(os.Stderr, "soak: stopped:", err)
		os.Exit(130)
	default:
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}
