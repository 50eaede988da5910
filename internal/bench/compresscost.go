package bench

import (
	"syscall"
	"time"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/compress"
)

// orderBatchEvents is the most events of a batch in every batched figure.
const orderBatchEvents = 100

// orderBatches returns n batches of per order events as the relay encodes
// a structured batch: a JSON array of CloudEvents documents (envelope's
// bytes), numbered 1, 2, … with fresh ids, two seconds apart.
func orderBatches(n, per int) [][]byte {
	ps := orderPayloads(1, n*per)
	t0 := time.Date(2026, 12, 4, 8, 0, 0, 0, time.UTC)
	out := make([][]byte, n)
	for i := range out {
		b := []byte{'['}
		for j := range per {
			seq := i*per + j + 1
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, envelope(int64(seq), outbox.NewID(), t0.Add(time.Duration(seq)*2*time.Second), ps[seq-1])...)
		}
		out[i] = append(b, ']')
	}
	return out
}

// compressCost compresses the batches in turn with one compressor on one
// goroutine, as the relay does, for at least d: the CPU time per event
// (the process's, user and system: on a shared machine the wall time
// counts other programs' turns too), and the compressed bytes over the
// uncompressed.
func compressCost(alg compress.Alg, batches [][]byte, per int, d time.Duration) (perEvent time.Duration, ratio float64, err error) {
	c, err := compress.NewCompressor(alg)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	var buf []byte
	in, out := 0, 0
	for _, b := range batches {
		buf = c.Append(buf[:0], b) // a warm-up, and the ratio
		in += len(b)
		out += len(buf)
	}
	events := 0
	start, cpu0 := time.Now(), cpuTime()
	for time.Since(start) < d {
		for _, b := range batches {
			buf = c.Append(buf[:0], b)
		}
		events += len(batches) * per
	}
	return (cpuTime() - cpu0) / time.Duration(events), float64(out) / float64(in), nil
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
