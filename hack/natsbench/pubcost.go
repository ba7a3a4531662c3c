package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pubCost is -pubcost: what storing a replay log costs a nats-server per
// byte. It publishes the same number of bytes (-pubcost-bytes) to a fresh
// JetStream stream on file storage in messages of each size, once
// pipelined (PublishAsync, as many in flight as the client allows) and
// once one at a time (each publish waits for its PubAck, as the Tee's
// writes do), and prints the server's CPU time per publish and per 270
// bytes (the size of a record of a 100-byte delivery). Run it against a
// server of its own (-server, -server-pid), so that nothing else's work is
// counted.
func pubCost(ctx context.Context, o options) error {
	if o.serverPID == 0 {
		return errors.New("-pubcost needs -server-pid, the server's process")
	}
	var sizes []int
	for _, f := range splitList(o.pubCostSizes) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 || n > o.pubCostBytes {
			return fmt.Errorf("-pubcost-sizes: %q is not a size between 1 and -pubcost-bytes", f)
		}
		sizes = append(sizes, n)
	}
	nc, err := nats.Connect("nats://"+o.server, nats.Name("natsbench-pubcost"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	fmt.Printf("%s, %d bytes per size and mode, server %s (PID %d)\n\n", time.Now().UTC().Format(time.RFC3339), o.pubCostBytes, o.server, o.serverPID)
	fmt.Println("| mode | message bytes | publishes | server CPU | µs per publish | µs per 270 bytes | wall time |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, sync := range []bool{false, true} {
		for _, size := range sizes {
			if err := measure(ctx, js, o.serverPID, size, o.pubCostBytes, sync); err != nil {
				return err
			}
		}
	}
	return nil
}

// measure publishes total bytes in messages of size to a fresh stream and
// prints the server's CPU time for it.
func measure(ctx context.Context, js jetstream.JetStream, pid, size, total int, sync bool) (err error) {
	name := fmt.Sprintf("natsbench-pubcost-%d", time.Now().UnixNano())
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
