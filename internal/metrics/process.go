package metrics

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// userHZ is the unit of the times in /proc/PID/stat: the kernel reports
// them in USER_HZ, 100 on every Linux platform Go supports.
const userHZ = 100

// Process reads the process's families that client_golang's process
// collector exposes under the same names, help and units (its figures
// from /proc/self/limits and /proc/self/stat, its open files), so that
// what watches a Go program's process_* series watches the till's too. It
// leaves out process_network_*, which count the whole network namespace's
// traffic rather than the process's. Where /proc is missing it returns
// the families it could read, perhaps none.
func Process(context.Context) []Family {
	var out []Family
	gauge := func(name, help string, v float64) {
		out = append(out, Family{Name: name, Help: help, Type: Gauge, Samples: one(v)})
	}
	if st, err := readProcStat(); err == nil {
		out = append(out, Family{Name: "process_cpu_seconds_total", Help: "Total user and system CPU time spent in seconds.", Type: Counter,
			Samples: one(float64(st.utime+st.stime) / userHZ)})
		gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", float64(st.vsize))
		gauge("process_resident_memory_bytes", "Resident memory size in bytes.", float64(st.rss*int64(os.Getpagesize())))
		if boot, err := bootTime(); err == nil {
			gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", float64(boot)+float64(st.starttime)/userHZ)
		}
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		gauge("process_open_fds", "Number of open file descriptors.", float64(len(fds)))
	}
	if b, err := os.ReadFile("/proc/self/limits"); err == nil {
		if v, ok := softLimit(b, "Max open files"); ok {
			gauge("process_max_fds", "Maximum number of open file descriptors.", v)
		}
		if v, ok := softLimit(b, "Max address space"); ok {
			gauge("process_virtual_memory_max_bytes", "Maximum amount of virtual memory available in bytes.", v)
		}
	}
	return out
}

// procStat holds the fields of /proc/self/stat that Process reports.
type procStat struct {
	utime, stime, starttime uint64 // in USER_HZ
	vsize                   uint64 // bytes
	rss                     int64  // pages
}

func readProcStat() (procStat, error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(b)
}

// parseProcStat parses proc(5)'s /proc/PID/stat. The command's name, in
// parentheses, may hold spaces and parentheses itself: the fields start
// after the last ")".
func parseProcStat(b []byte) (procStat, error) {
	var st procStat
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return st, errUnexpected("/proc/self/stat")
	}
	// f[0] is field 3 of proc(5), the state.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 22 {
		return st, errUnexpected("/proc/self/stat")
	}
	var errs [5]error
	st.utime, errs[0] = strconv.ParseUint(f[11], 10, 64)     // 14
	st.stime, errs[1] = strconv.ParseUint(f[12], 10, 64)     // 15
	st.starttime, errs[2] = strconv.ParseUint(f[19], 10, 64) // 22
	st.vsize, errs[3] = strconv.ParseUint(f[20], 10, 64)     // 23
	st.rss, errs[4] = strconv.ParseInt(f[21], 10, 64)        // 24
	for _, err := range errs {
		if err != nil {
			return procStat{}, errUnexpected("/proc/self/stat")
		}
	}
	return st, nil
}

// bootTime reads the system's boot time, in Unix seconds, from /proc/stat.
func bootTime() (int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errUnexpected("/proc/stat")
}

func errUnexpected(file string) error { return fmt.Errorf("metrics: %s: unexpected format", file) }

// softLimit reads a soft limit from proc(5)'s /proc/PID/limits, whose
// columns are aligned with spaces: "Max open files  1024  4096  files".
// "unlimited" reads as the largest uint64, as client_golang's does.
func softLimit(limits []byte, name string) (float64, bool) {
	for line := range strings.Lines(string(limits)) {
		rest, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		if f[0] == "unlimited" {
			return math.MaxUint64, true
		}
		v, err := strconv.ParseUint(f[0], 10, 64)
		return float64(v), err == nil
	}
	return 0, false
}
