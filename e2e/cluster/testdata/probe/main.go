// Command probe is the workload of the cluster's end-to-end test. It dials
// each address given as an argument and prints "ok ADDR" or "fail ADDR:
// ERROR", then counts once a second until it is stopped, so that a
// checkpoint has a live process with state to capture. Each count line
// carries a token drawn at start: a restored process goes on with the same
// token, a fresh start draws a new one.
package main

import (
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"time"
)

func main() {
	for _, addr := range os.Args[1:] {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			fmt.Printf("fail %s: %v\n", addr, err)
			continue
		}
		c.Close()
		fmt.Printf("ok %s\n", addr)
	}
	token := rand.Text()
	for i := 0; ; i++ {
		fmt.Printf("count %d %s\n", i, token)
		time.Sleep(time.Second)
	}
}
