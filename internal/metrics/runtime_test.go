package metrics

import (
	"context"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRuntime reads the Go runtime's families and checks them against what
// the test can set or count.
func TestRuntime(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(73))
	stop := make(chan struct{})
	for range 10 {
		go func() { <-stop }()
	}
	fs := Runtime(context.Background())
	close(stop)
	require.Equal(t, []string{"go_goroutines", "go_threads", "go_info", "go_memstats_heap_alloc_bytes", "go_memstats_sys_bytes",
		"go_gc_gogc_percent", "go_gc_gomemlimit_bytes", "go_sched_gomaxprocs_threads"}, names(fs))
	require.GreaterOrEqual(t, value(t, fs, "go_goroutines"), 11.0, "these ten and the test's")
	require.Equal(t, 73.0, value(t, fs, "go_gc_gogc_percent"))
	require.Equal(t, float64(runtime.GOMAXPROCS(0)), value(t, fs, "go_sched_gomaxprocs_threads"))
	require.Positive(t, value(t, fs, "go_threads"))
	require.Greater(t, value(t, fs, "go_memstats_sys_bytes"), value(t, fs, "go_memstats_heap_alloc_bytes"))
	require.Positive(t, value(t, fs, "go_memstats_heap_alloc_bytes"))
	for _, f := range fs {
		if f.Name == "go_info" {
			require.Equal(t, []string{runtime.Version()}, f.Samples[0].LabelValues)
		}
	}
}
