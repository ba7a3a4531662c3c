package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ms2m/ms2m/internal/ociimage"
)

// ServeHost runs the host services that pods and nodes reach at HostIP: the
// image registry (blobs under the state folder) and TCP forwarders to the
// broker, which listens on loopback only. It returns when ctx is done.
// `hack/cluster serve-host` runs it as the detached helper that Up starts.
func ServeHost(ctx context.Context, stateDir string, log *slog.Logger) error {
	l := layout{dir: stateDir}
	reg, err := ociimage.ServeRegistry(hostAddr(RegistryPort), l.registryDir(), ociimage.WithRequestLog(log))
	if err != nil {
		return fmt.Errorf("image registry on %s: %w", hostAddr(RegistryPort), err)
	}
	defer reg.Close()
	log.Info("registry up", "addr", reg.Addr(), "dir", l.registryDir())

	var wg sync.WaitGroup
	for _, port := range []int{AMQPPort, StreamPort, NATSPort} {
		from, to := hostAddr(port), net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", from)
		if errors.Is(err, syscall.EADDRINUSE) {
			// The broker itself listens on all addresses for this port
			// (RabbitMQ's stream listener does by default), so it is
			// already reachable on the bridge.
			log.Info("no forwarder needed: the port is served on all addresses already", "addr", from)
			continue
		}
		if err != nil {
			return fmt.Errorf("forwarder %s -> %s: %w", from, to, err)
		}
		log.Info("forwarding", "from", from, "to", to)
		wg.Add(1)
		go func() {
			defer wg.Done()
			forward(ctx, ln, to, log)
		}()
	}
	<-ctx.Done()
	wg.Wait()
	return nil
}

// ForwardToLoopback forwards HostIP:port to the same port on loopback
// until ctx is done, as ServeHost does for the brokers' ports: for a test
// whose cluster's host services started before a port was added to them.
func ForwardToLoopback(ctx context.Context, port int, log *slog.Logger) error {
	ln, err := net.Listen("tcp", hostAddr(port))
	if err != nil {
		return fmt.Errorf("forwarder %s: %w", hostAddr(port), err)
	}
	go forward(ctx, ln, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), log)
	return nil
}

func hostAddr(port int) string { return net.JoinHostPort(HostIP, strconv.Itoa(port)) }

// forward accepts connections on ln until ctx is done and pipes each to
// upstream, half-closing each direction when its source ends.
func forward(ctx context.Context, ln net.Listener, upstream string, log *slog.Logger) {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				log.Error("accept", "addr", ln.Addr().String(), "err", err)
			}
			return
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			pipe(ctx, c.(*net.TCPConn), upstream, log)
		}()
	}
}

func pipe(ctx context.Context, down *net.TCPConn, upstream string, log *slog.Logger) {
	defer down.Close()
	d := net.Dialer{Timeout: 5 * time.Second}
	uc, err := d.DialContext(ctx, "tcp", upstream)
	if err != nil {
		log.Warn("dial upstream", "from", down.RemoteAddr().String(), "to", upstream, "err", err)
		return
	}
	up := uc.(*net.TCPConn)
	defer up.Close()
	stop := context.AfterFunc(ctx, func() {
		down.Close()
		up.Close()
	})
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	half := func(dst, src *net.TCPConn) {
		defer wg.Done()
		io.Copy(dst, src)    //nolint:errcheck // an error ends this direction, like EOF
		_ = dst.CloseWrite() // fails only if dst is closed already
	}
	go half(up, down)
	go half(down, up)
	wg.Wait()
}
