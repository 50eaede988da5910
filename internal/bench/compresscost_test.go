package bench

import (
	"testing"

	"github.com/edgeoutbox/outbox/internal/compress"
)

// BenchmarkCompressOrderBatch is compression's cost per event on batches
// of 100 order events, in wall and CPU time (section 9's
// compress_*_ns_per_event is the CPU time), as a
// Go benchmark so that it runs on another architecture under an emulator:
// BENCHMARKS.md has the command for arm64 under qemu.
func BenchmarkCompressOrderBatch(b *testing.B) {
	batches := orderBatches(20, orderBatchEvents)
	size := 0
	for _, x := range batches {
		size += len(x)
	}
	for _, alg := range []compress.Alg{compress.Zstd, compress.Gzip} {
		b.Run(alg.String(), func(b *testing.B) {
			c, err := compress.NewCompressor(alg)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.SetBytes(int64(size / len(batches)))
			var buf []byte
			cpu0 := cpuTime()
			for i := 0; b.Loop(); i++ {
				buf = c.Append(buf[:0], batches[i%len(batches)])
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*orderBatchEvents), "ns/event")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N*orderBatchEvents), "cpu-ns/event")
		})
	}
}
