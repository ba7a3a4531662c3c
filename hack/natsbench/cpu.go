package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat's CPU times
// (100 on every architecture Go supports on Linux).
const clockTicks = 100

// selfCPU is the CPU time this process has used (user and system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the CPU time process pid has used, from /proc (10 ms steps).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return statCPU(string(b))
}

// statCPU reads utime and stime from the text of /proc/<pid>/stat. The
// command name (field 2) may hold spaces and parentheses, so the fields
// are counted from the last ')'.
func statCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command name", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat %q: too few fields", stat)
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("stat %q: bad utime or stime", stat)
	}
	return time.Duration(u+s) * time.Second / clockTicks, nil
}

// findProcess returns the PID of the one process named comm, or 0 when
// there is none or more than one.
func findProcess(comm string) int {
	paths, _ := filepath.Glob("/proc/[0-9]*/comm")
	pid := 0
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) != comm {
			continue
		}
		if pid != 0 {
			return 0
		}
		pid, _ = strconv.Atoi(filepath.Base(filepath.Dir(p)))
	}
	return pid
}

// cpuMeter measures the CPU time this process, the server and the log's
// server (when it is another) use over an interval.
type cpuMeter struct {
	serverPID, logPID int
	self, server, log time.Duration
}

func (m *cpuMeter) start() {
	m.self = selfCPU()
	m.server = pidCPU(m.serverPID)
	m.log = pidCPU(m.logPID)
}

// stop returns the CPU time used since start, in microseconds per
// message over n messages (a server's 0 when its PID is unknown).
func (m *cpuMeter) stop(n int) (selfUs, serverUs, logUs float64) {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	since := func(pid int, start time.Duration) float64 {
		if pid == 0 {
			return 0
		}
		d, err := procCPU(pid)
		if err != nil {
			return 0
		}
		return per(d - start)
	}
	return per(selfCPU() - m.self), since(m.serverPID, m.server), since(m.logPID, m.log)
}

// pidCPU is procCPU, 0 for PID 0 or an error.
func pidCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	d, _ := procCPU(pid)
	return d
}
