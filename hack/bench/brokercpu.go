package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times
// (100 on every Linux this runs on).
const clockTicks = 100

// brokerCPU returns the CPU time, in seconds, that the local RabbitMQ
// (the process named beam.smp) has used so far, user and system. ok is
// false when no such process is found (a broker on another host): the
// bench then reports no broker CPU.
func brokerCPU() (seconds float64, ok bool) {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if comm, ticks, ok := parseStat(b); ok && comm == "beam.smp" {
			return float64(ticks) / clockTicks, true
		}
	}
	return 0, false
}

// parseStat reads a process's name and its user plus system time, in clock
// ticks, from its /proc/PID/stat. The name may hold spaces and parentheses,
// so it ends at the last ')'.
func parseStat(b []byte) (comm string, ticks uint64, ok bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, false
	}
	// After the name: state, ppid, ... utime is the 14th field of the line
	// and stime the 15th, so the 12th and 13th after the name.
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 13 {
		return "", 0, false
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, false
	}
	return string(b[open+1 : end]), ut + st, true
}
