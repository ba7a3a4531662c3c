package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	reap := os.Getpid() == 1
	if reap {
		reapZombies() // children may have exited before Notify
	}
	fmt.Fprintln(os.Stderr, "pause: waiting for SIGTERM or SIGINT")
	for s := range sigs {
		if s == syscall.SIGCHLD {
			if reap {
				reapZombies()
			}
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: got %v, exiting\n", s)
		os.Exit(0)
	}
}

// reapZombies waits for every child that has exited, without blocking.
// Several exits may share one SIGCHLD, so it loops until none is left.
func reapZombies() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
	}
}
