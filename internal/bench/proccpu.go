package bench

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSample is the CPU time used so far by this process and by the
// programs it started, by program name (nats-server, postgres: each with
// the children it started and waited for), and the machine's busy and total
// time over all its CPUs, so that a run can say which of them used the
// CPU, and whether the machine had any left.
type cpuSample struct {
	self        time.Duration
	children    map[string]time.Duration
	busy, total time.Duration
}

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

func takeCPUSample() cpuSample {
	s := cpuSample{children: map[string]time.Duration{}}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	// Processes by parent: what this process started, and their children
	// (a PostgreSQL server's backends).
	type proc struct {
		ppid int
		comm string
		cpu  time.Duration
	}
	procs := map[int]proc{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid … utime stime cutime cstime (fields 14–17).
		open, end := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(string(b[end+1:]))
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		var ticks int64
		for _, v := range f[11:15] {
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
		procs[pid] = proc{ppid: ppid, comm: string(b[open+1 : end]), cpu: time.Duration(ticks) * clockTick}
	}
	me := os.Getpid()
	for pid, p := range procs {
		if p.ppid != me {
			continue
		}
		sum := p.cpu
		for _, c := range procs {
			if c.ppid == pid {
				sum += c.cpu
			}
		}
		s.children[p.comm] += sum
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal …
		for i, v := range f[1:] {
			if i >= 8 {
				break
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			d := time.Duration(n) * clockTick
			s.total += d
			if i != 3 && i != 4 { // idle, iowait
				s.busy += d
			}
		}
	}
	return s
}

// cpuUse is what was used between two samples.
type cpuUse struct {
	wall     time.Duration
	self     time.Duration
	children map[string]time.Duration
	// busy is the machine's busy share of all its CPUs (0..1), whoever
	// used them: other work on a shared machine shows here.
	busy float64
}

func (a cpuSample) until(b cpuSample, wall time.Duration) cpuUse {
	u := cpuUse{wall: wall, self: b.self - a.self, children: map[string]time.Duration{}}
	for k, v := range b.children {
		u.children[k] = v - a.children[k]
	}
	if t := b.total - a.total; t > 0 {
		u.busy = float64(b.busy-a.busy) / float64(t)
	}
	return u
}
