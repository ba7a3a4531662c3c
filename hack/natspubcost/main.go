package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	server := flag.String("server", "127.0.0.1:4222", "the NATS server (host:port), with JetStream")
	pid := flag.Int("server-pid", 0, "the server's PID, for its CPU time (required)")
	sizes := flag.String("sizes", "270,2700,24000,100000", "message sizes in bytes, comma-separated")
	total := flag.Int("bytes", 27<<20, "bytes published per size and mode")
	flag.Parse()
	if err := run(*server, *pid, *sizes, *total); err != nil {
		fmt.Fprintln(os.Stderr, "natspubcost:", err)
		os.Exit(1)
	}
}

func run(server string, pid int, sizeList string, total int) error {
	if pid == 0 {
		return errors.New("-server-pid: name the server's process")
	}
	var sizes []int
	for _, f := range strings.Split(sizeList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || n > total {
			return fmt.Errorf("-sizes: %q is not a size between 1 and -bytes", f)
		}
		sizes = append(sizes, n)
	}
	nc, err := nats.Connect("nats://"+server, nats.Name("natspubcost"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx := context.Background()
	fmt.Printf("%s, %d bytes per size and mode, server %s (PID %d)\n\n", time.Now().UTC().Format(time.RFC3339), total, server, pid)
	fmt.Println("| mode | message bytes | publishes | server CPU | µs per publish | µs per 270 bytes | wall time |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, sync := range []bool{false, true} {
		for _, size := range sizes {
			if err := measure(ctx, js, pid, size, total, sync); err != nil {
				return err
			}
		}
	}
	return nil
}

// measure publishes total bytes in messages of size to a fresh stream and
// prints the server's CPU time for it.
func measure(ctx context.Context, js jetstream.JetStream, pid, size, total int, sync bool) (err error) {
	name := fmt.Sprintf("natspubcost-%d", time.Now().UnixNano())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}, Storage: jetstream.FileStorage}); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, js.DeleteStream(ctx, name)) }()
	body := make([]byte, size)
	for i := range body {
		body[i] = byte(i * 7)
	}
	n := total / size
	c0, err := procCPU(pid)
	if err != nil {
		return err
	}
	t0 := time.Now()
	for range n {
		if sync {
			_, err = js.Publish(ctx, name, body)
		} else {
			_, err = js.PublishAsync(name, body, jetstream.WithStallWait(time.Minute))
		}
		if err != nil {
			return err
		}
	}
	if !sync {
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			return errors.New("the server did not acknowledge every publish within a minute")
		}
	}
	wall := time.Since(t0)
	c1, err := procCPU(pid)
	if err != nil {
		return err
	}
	cpu := c1 - c0
	mode := "pipelined"
	if sync {
		mode = "one at a time"
	}
	us := float64(cpu.Microseconds())
	fmt.Printf("| %s | %d | %d | %s | %.1f | %.2f | %s |\n", mode, size, n, cpu, us/float64(n), us/(float64(n*size)/270), wall.Round(time.Millisecond))
	return nil
}

// procCPU is the CPU time (user and system) process pid has used, from
// /proc (10 ms steps).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime or stime", pid)
	}
	return time.Duration(u+st) * 10 * time.Millisecond, nil
}
