package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// ballast is kept reachable for the whole run.
var ballast []byte

func main() {
	mb, err := strconv.Atoi(os.Getenv("BALLAST_MB"))
	if err != nil || mb < 0 || mb > 1<<20 {
		fmt.Fprintf(os.Stderr, "ballast: BALLAST_MB=%q: want a whole number of MiB from 0 to 1048576\n", os.Getenv("BALLAST_MB"))
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	ballast = make([]byte, mb<<20)
	fill(ballast)
	fmt.Printf("ballast mb=%d rss_kib=%d\n", mb, rssKiB())
	fmt.Println("ready")
	<-ctx.Done()
	runtime.KeepAlive(ballast)
}

// fill writes xorshift64 output over b, eight bytes at a time.
func fill(b []byte) {
	words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range words {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		words[i] = x
	}
}

// rssKiB is VmRSS from /proc/self/status, or -1.
func rssKiB() int {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err == nil {
				return n
			}
		}
	}
	return -1
}
