package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"sync/atomic"
	"time"
)

// memory drains a large backlog with a relay in a process of its own (so
// that the broker and this program do not count) and reports its peaks.
func (r *runner) memory(ctx context.Context) error {
	n := r.sz.memBacklog
	r.progress("  writing a backlog of %d messages", n)
	t := time.Now()
	path, err := r.makeBacklog(ctx, "memory.db", n)
	if err != nil {
		return err
	}
	r.progress("  written in %.1f s", time.Since(t).Seconds())
	b, err := newMochi()
	if err != nil {
		return err
	}
	defer b.close()
	var got atomic.Int64
	b.setHandler(func(string, []byte) { got.Add(1) })
	args := append(append([]string{}, r.cfg.Self[1:]...), "relay", "--db", path, "--broker", b.url(), "--window", "64")
	out, err := exec.CommandContext(ctx, r.cfg.Self[0], args...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return fmt.Errorf("relay process: %v: %s", err, ee.Stderr)
		}
		return fmt.Errorf("relay process: %w", err)
	}
	var res relayResult
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("relay process output: %w", err)
	}
	if res.Sent < int64(n) || got.Load() < int64(n) {
		return fmt.Errorf("relay process sent %d, subscriber got %d, of %d", res.Sent, got.Load(), n)
	}
	const mib = 1 << 20
	heap := float64(res.PeakHeapBytes) / mib
	r.rep.set("memory_backlog", n)
	r.rep.set("memory_peak_heap_mib", heap)
	r.rep.check("memory_peak_heap_mib", heap <= 32)
	r.rep.set("memory_peak_heap_inuse_mib", float64(res.PeakInuseBytes)/mib)
	r.rep.set("memory_peak_rss_mib", float64(res.PeakRSSBytes)/mib)
	r.rep.set("memory_drain_msgs_per_s", float64(n)/res.Seconds)
	r.progress("  peak heap %.1f MiB, in use %.1f MiB, RSS %.1f MiB; %.0f msg/s", heap, float64(res.PeakInuseBytes)/mib, float64(res.PeakRSSBytes)/mib, float64(n)/res.Seconds)
	scale := ""
	if r.cfg.Mode != Full {
		scale = " (" + string(r.cfg.Mode) + "; --full drains 1,000,000)"
	}
	r.rep.note(5, "A relay process of its own (`outboxlab bench child relay`, the same library code as `outboxctl relay`) drains %s pending messages%s of %d bytes to the in-process broker of this program, window 64, default GOGC; "+
		"its Go heap is sampled every millisecond through runtime/metrics. RSS includes SQLite's page cache (allocated outside the Go heap). "+
		"Allocations per message: `runtime.MemStats` over 2,000 transactions through `Transact` at NORMAL, Enqueue's minus the business transaction's.",
		thousands(int64(n)), scale, payloadLen)
	return nil
}
