package metrics

import (
	"context"
	"runtime"
	rtmetrics "runtime/metrics"
)

// runtimeGauges are the Go runtime's figures Runtime reads from
// runtime/metrics, under client_golang's names and help.
var runtimeGauges = [...]struct{ name, help, key string }{
	{"go_memstats_heap_alloc_bytes", "Number of heap bytes allocated and currently in use, same as go_memstats_alloc_bytes. Equals to /memory/classes/heap/objects:bytes.", "/memory/classes/heap/objects:bytes"},
	{"go_memstats_sys_bytes", "Number of bytes obtained from system. Equals to /memory/classes/total:byte.", "/memory/classes/total:bytes"},
	{"go_gc_gogc_percent", "Heap size target percentage configured by the user, otherwise 100. This value is set by the GOGC environment variable, and the runtime/debug.SetGCPercent function. Sourced from /gc/gogc:percent.", "/gc/gogc:percent"},
	{"go_gc_gomemlimit_bytes", "Go runtime memory limit configured by the user, otherwise math.MaxInt64. This value is set by the GOMEMLIMIT environment variable, and the runtime/debug.SetMemoryLimit function. Sourced from /gc/gomemlimit:bytes.", "/gc/gomemlimit:bytes"},
	{"go_sched_gomaxprocs_threads", "The current runtime.GOMAXPROCS setting, or the number of operating system threads that can execute user-level Go code simultaneously. Sourced from /sched/gomaxprocs:threads.", "/sched/gomaxprocs:threads"},
}

// Runtime reads a few of the Go runtime's families that client_golang's
// Go collector exposes, under the same names and help: the goroutines and
// threads, the heap in use and the memory taken from the system, the GC's
// settings, and go_info. What watches for a leak or a memory limit on a
// device needs no more; the rest of the collector's (the GC's pause
// summary, every go_memstats_*) is left out.
func Runtime(context.Context) []Family {
	threads, _ := runtime.ThreadCreateProfile(nil)
	out := []Family{
		{Name: "go_goroutines", Help: "Number of goroutines that currently exist.", Type: Gauge, Samples: one(float64(runtime.NumGoroutine()))},
		{Name: "go_threads", Help: "Number of OS threads created.", Type: Gauge, Samples: one(float64(threads))},
		{Name: "go_info", Help: "Information about the Go environment.", Type: Gauge, Labels: []string{"version"},
			Samples: []Sample{{LabelValues: []string{runtime.Version()}, Value: 1}}},
	}
	samples := make([]rtmetrics.Sample, len(runtimeGauges))
	for i, g := range runtimeGauges {
		samples[i].Name = g.key
	}
	rtmetrics.Read(samples)
	for i, g := range runtimeGauges {
		var v float64
		switch samples[i].Value.Kind() {
		case rtmetrics.KindUint64:
			v = float64(samples[i].Value.Uint64())
		case rtmetrics.KindFloat64:
			v = samples[i].Value.Float64()
		default: // not in this Go's runtime
			continue
		}
		out = append(out, Family{Name: g.name, Help: g.help, Type: Gauge, Samples: one(v)})
	}
	return out
}
