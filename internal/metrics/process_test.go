package metrics

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestParseProcStat parses a stat line whose command name holds spaces and
// parentheses, and refuses short or garbled ones.
func TestParseProcStat(t *testing.T) {
	line := "4242 (we(ird) na)me) S 1 4242 4242 0 -1 4194560 2000 0 0 0 " +
		"150 70 0 0 20 0 9 0 123456 1760653312 4286 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
	st, err := parseProcStat([]byte(line))
	require.NoError(t, err)
	require.Equal(t, procStat{utime: 150, stime: 70, starttime: 123456, vsize: 1760653312, rss: 4286}, st)
	for _, bad := range []string{"", "4242 (x) S 1 2 3", strings.ReplaceAll(line, ")", ""), "4242 (x) S 1 4242 4242 0 -1 4194560 2000 0 0 0 x 70 0 0 20 0 9 0 123456 1 2"} {
		_, err := parseProcStat([]byte(bad))
		require.Error(t, err, "%q", bad)
	}
}

// TestSoftLimit reads the soft column, and "unlimited" as client_golang does.
func TestSoftLimit(t *testing.T) {
	limits := []byte("Limit                     Soft Limit           Hard Limit           Units     \n" +
		"Max address space         unlimited            unlimited            bytes     \n" +
		"Max open files            1024                 524288               files     \n")
	v, ok := softLimit(limits, "Max open files")
	require.True(t, ok)
	require.Equal(t, 1024.0, v)
	v, ok = softLimit(limits, "Max address space")
	require.True(t, ok)
	require.Equal(t, float64(^uint64(0)), v)
	_, ok = softLimit(limits, "Max processes")
	require.False(t, ok)
}

// TestProcess reads this test process's families and checks them against
// what the test knows of itself.
func TestProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	fs := Process(context.Background())
	require.Equal(t, []string{"process_cpu_seconds_total", "process_virtual_memory_bytes", "process_resident_memory_bytes",
		"process_start_time_seconds", "process_open_fds", "process_max_fds", "process_virtual_memory_max_bytes"}, names(fs))
	start := time.Unix(0, int64(value(t, fs, "process_start_time_seconds")*1e9))
	require.WithinDuration(t, time.Now(), start, 10*time.Minute, "the test started recently")
	require.Greater(t, value(t, fs, "process_resident_memory_bytes"), 1e6)
	require.GreaterOrEqual(t, value(t, fs, "process_virtual_memory_bytes"), value(t, fs, "process_resident_memory_bytes"))
	open := value(t, fs, "process_open_fds")
	var files []*os.File
	for range 5 {
		f, err := os.Open("/proc/self/stat")
		require.NoError(t, err)
		defer f.Close()
		files = append(files, f)
	}
	require.GreaterOrEqual(t, value(t, Process(context.Background()), "process_open_fds"), open+5, "the files opened counted")
	require.GreaterOrEqual(t, value(t, fs, "process_max_fds"), open)
	require.Positive(t, value(t, fs, "process_cpu_seconds_total")+1)
}
