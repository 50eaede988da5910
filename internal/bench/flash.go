package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgeoutbox/outbox/compression"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/compress"
	"github.com/edgeoutbox/outbox/internal/powerfs"
)

// flash: what the outbox writes to the storage (section 10), counted where
// SQLite's requests reach the file system: the database sits on powerfs
// (internal/powerfs), a FUSE mount that sees every write and fsync of its
// files. A process's write_bytes (/proc/self/io) would count pages dirtied
// by every file of the process, broker included, and no fsync.

// flashSlowDelays are the fsync delays of the slow card: an SD card's
// sync takes milliseconds, a worn or cheap one tens of them. None is the
// mount alone, which FUSE slows by itself.
var flashSlowDelays = []time.Duration{0, 10 * time.Millisecond, 50 * time.Millisecond}

// flashTargetDelay is the delay at which the drain over the link has a
// target (≥ 0.90 of the link's limit), and the one smoke mode runs.
const flashTargetDelay = 10 * time.Millisecond

// flashDrainCase is one drain whose writes are counted: the relay's
// options are the case's, so that the same drain runs with and without
// batching.
type flashDrainCase struct {
	key, name string
	opts      outbox.RelayOptions
}

var flashDrains = []flashDrainCase{
	{"drain", "drain, one event per message", outbox.RelayOptions{}},
	{"drain_batched", "drain in batches of up to 100 events, zstd", outbox.RelayOptions{
		Batch: outbox.BatchOptions{MaxEvents: 100}, Compress: compression.Zstd()}},
}

// flashDayEvents is a busy till's day: the sizing line of FLEET.md.
const flashDayEvents = linkDayEvents

// flashFigures is what one case wrote, per event.
type flashFigures struct {
	events                 int
	bytes, pageBytes, perK float64 // per event, per event, per 1,000 events
	shmBytes               float64 // per event, through the -shm mapping
	relaySyncsPerK         float64 // RelayStats.WALSyncs per 1,000 events (drains)
	txPerS                 float64 // enqueue: transactions per second
}

// flashUse sums the counts of the files of one database (name, name-wal,
// ...) and of the mount's root directory, between two snapshots.
func flashUse(before, after map[string]powerfs.FileCounts, db string, events int) flashFigures {
	f := flashFigures{events: events}
	var written, pages, fsyncs, shm int64
	for name, a := range after {
		if name != "." && !strings.HasPrefix(name, db) {
			continue
		}
		b := before[name]
		fsyncs += a.Fsyncs - b.Fsyncs
		if strings.HasSuffix(name, "-shm") {
			shm += a.Bytes - b.Bytes
			continue
		}
		written += a.Bytes - b.Bytes
		// Pages synced, and those written and not synced yet, which
		// the file system writes back later.
		pages += a.Pages - b.Pages + a.Dirty - b.Dirty
	}
	n := float64(events)
	f.bytes = float64(written) / n
	f.pageBytes = float64(pages*4096) / n
	f.perK = float64(fsyncs) * 1000 / n
	f.shmBytes = float64(shm) / n
	return f
}

func (r *runner) flash(ctx context.Context) error {
	sz := r.sz
	backing := filepath.Join(r.dir, "flash-backing")
	if err := os.Mkdir(backing, 0o755); err != nil {
		return err
	}
	fsDir := filepath.Join(r.dir, "flash-powerfs")
	if err := os.Mkdir(fsDir, 0o755); err != nil {
		return err
	}
	pfs, err := powerfs.Mount(backing, fsDir, powerfs.Options{})
	if errors.Is(err, powerfs.ErrUnavailable) {
		r.rep.missing[10] = err.Error()
		r.progress("  not run: %v", err)
		return nil
	}
	if err != nil {
		return err
	}
	defer pfs.Close()
	mnt := pfs.Mountpoint()
	b, err := newMochi()
	if err != nil {
		return err
	}
	defer b.close()

	// 1. Enqueue at FULL and NORMAL.
	figs := map[string]flashFigures{}
	for _, m := range []struct {
		key  string
		sync outbox.Synchronous
	}{{"full", outbox.SyncFull}, {"normal", outbox.SyncNormal}} {
		f, err := r.flashEnqueue(ctx, pfs, "enqueue-"+m.key+".db", m.sync, 20, sz.flashEnqueue)
		if err != nil {
			return fmt.Errorf("enqueue %s: %w", m.key, err)
		}
		r.flashSet("enqueue_"+m.key, f)
		r.rep.set("flash_enqueue_"+m.key+"_tx_per_s", f.txPerS)
		figs["enqueue_"+m.key] = f
	}

	// 2. Drains, with their marks, checkpoints and purge.
	tmpl, err := r.makeBacklog(ctx, "flash-backlog.db", sz.flashDrain)
	if err != nil {
		return err
	}
	for _, d := range flashDrains {
		f, err := r.flashDrain(ctx, pfs, backing, b, tmpl, d)
		if err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
		r.flashSet(d.key, f)
		r.rep.set("flash_"+d.key+"_relay_fsyncs_per_1000", f.relaySyncsPerK)
		figs[d.key] = f
	}
	full := figs["enqueue_full"]
	for _, k := range []string{"drain", "drain_batched"} {
		drain := figs[k]
		day := (full.pageBytes + drain.pageBytes) * flashDayEvents / 1e6
		key := "flash_day_mb"
		if k == "drain_batched" {
			key = "flash_day_batched_mb"
		}
		r.rep.set(key, day)
		r.progress("  a day of %d events at FULL, %s: %.1f MB written back (enqueue %.0f B + drain %.0f B per event)", flashDayEvents, k, day, full.pageBytes, drain.pageBytes)
	}

	// 3. A slow card: enqueue at FULL, and the drain over the cellular
	// link of section 9, at each fsync delay.
	enc := linkEncodingOf("structured5")
	lb, err := r.linkBytesOf(ctx, b, "flash-link-bytes.db", enc, sz.linkBytesEvents)
	if err != nil {
		return err
	}
	limit, bound := lb.limit(linkDayWindow)
	n := max(int(math.Ceil(limit*sz.linkDrainSeconds)), 4*linkDayWindow)
	linkTmpl, err := r.makeBacklog(ctx, fmt.Sprintf("flash-link-%d.db", n), n)
	if err != nil {
		return err
	}
	for _, delay := range flashSlowDelays {
		if !sz.flashSlowAll && delay != flashTargetDelay {
			continue
		}
		if err := pfs.SetFsyncDelay(delay); err != nil {
			return err
		}
		p := fmt.Sprintf("flash_slow%d_", delay.Milliseconds())
		f, err := r.flashEnqueue(ctx, pfs, fmt.Sprintf("slow%d-enqueue.db", delay.Milliseconds()), outbox.SyncFull, 2, sz.flashSlowTx)
		if err != nil {
			return fmt.Errorf("enqueue, fsync delay %s: %w", delay, err)
		}
		r.rep.set(p+"enqueue_full_tx_per_s", f.txPerS)
		r.rep.set(p+"enqueue_full_fsyncs_per_tx", f.perK/1000)
		name := fmt.Sprintf("slow%d-link.db", delay.Milliseconds())
		res, err := r.linkDrainAt(ctx, b, linkTmpl, filepath.Join(backing, name), filepath.Join(mnt, name), n, enc, linkDayWindow, outbox.RelayOptions{})
		if err != nil {
			return fmt.Errorf("link drain, fsync delay %s: %w", delay, err)
		}
		lim, _ := lb.limit(res.window)
		r.rep.set(p+"link_events", n)
		r.rep.set(p+"link_limit_msgs_per_s", lim)
		r.rep.set(p+"link_msgs_per_s", res.rate)
		r.rep.set(p+"link_vs_limit", res.rate/lim)
		if delay == flashTargetDelay {
			r.rep.check(p+"link_vs_limit", res.rate/lim >= 0.90)
		}
		r.rep.set(p+"link_longest_gap_ms", ms(res.gap))
		r.rep.set(p+"link_fsyncs_per_1000", res.walSyncs)
		r.progress("  fsync delay %s: enqueue at FULL %.0f tx/s (%.2f fsyncs per transaction); link drain %.0f msg/s, %.2f of the limit (%.0f, %s), longest gap %s, %.1f relay fsyncs per 1,000 (%.1f for the marks)",
			delay, f.txPerS, f.perK/1000, res.rate, res.rate/lim, lim, bound, res.gap.Round(time.Millisecond), res.walSyncs, res.markSyncs)
		if delay != flashTargetDelay {
			continue
		}
		// In batches, the link's window of messages carries a hundred
		// times the events: the larger backlog of the drains above, its
		// time and the relay's fsyncs, which count per batch.
		name = fmt.Sprintf("slow%d-link-batched.db", delay.Milliseconds())
		batched := flashDrains[len(flashDrains)-1]
		res, err = r.linkDrainAt(ctx, b, tmpl, filepath.Join(backing, name), filepath.Join(mnt, name), sz.flashDrain, enc, linkDayWindow, batched.opts)
		if err != nil {
			return fmt.Errorf("link drain in batches, fsync delay %s: %w", delay, err)
		}
		p += "batched_"
		r.rep.set(p+"link_events", sz.flashDrain)
		r.rep.set(p+"link_seconds", res.total.Seconds())
		r.rep.set(p+"link_longest_gap_ms", ms(res.gap))
		r.rep.set(p+"link_fsyncs_per_1000", res.walSyncs)
		r.progress("  fsync delay %s, %s: link drain of %d events in %s, longest gap %s, %.2f relay fsyncs per 1,000 (%.2f for the marks)",
			delay, batched.name, sz.flashDrain, res.total.Round(10*time.Millisecond), res.gap.Round(time.Millisecond), res.walSyncs, res.markSyncs)
	}
	if err := pfs.SetFsyncDelay(0); err != nil {
		return err
	}

	r.rep.note(10, "Counted by powerfs (internal/powerfs), the project's FUSE file system, with the database on its mount (backing directory on this machine's disk, no fsync delay unless said): "+
		"bytes are what SQLite wrote to the database and its WAL (write calls); pages are the 4 KiB pages the file system writes back: at each fsync, those written since the file's previous one, each once, "+
		"plus those written and not synced at the end; fsyncs are every fsync and fdatasync of the database's files and of their directory. "+
		"SQLite's -shm index is a shared mapping, never synced: the kernel writes its dirty pages back on its own schedule (%.1f B per event reached the mount in the drain). "+
		"On a real device the file system's own journal (ext4: a commit of a few 4 KiB blocks per fsync that changes metadata) and the card's write amplification (its flash translation layer rewrites whole erase blocks) come on top.",
		figs["drain"].shmBytes)
	r.rep.note(10, "Enqueue: %s events, one order row and its event per `Transact`, after 20 unmeasured. Drain: a backlog of %s events (committed at NORMAL in transactions of 5,000, not counted) "+
		"drained by a relay with the defaults (window 64, FULL) to the in-process mochi over loopback, until every event is delivered (order checked), marked sent and purged "+
		"(`Retention` -1, `PurgeInterval` 200 ms: rows deleted as they are sent) and the free pages are reclaimed; its relay's fsyncs are `RelayStats.WALSyncs` (reads and marks), the rest are checkpoints'. "+
		"A day: %s events × (enqueue at FULL + drain), pages.",
		thousands(int64(sz.flashEnqueue)), thousands(int64(sz.flashDrain)), thousands(flashDayEvents))
	r.rep.note(10, "A slow card: every fsync, fdatasync and directory fsync through the mount takes at least the delay (`powerfs.Options.FsyncDelay`); with none, the mount alone. "+
		"Enqueue: %s transactions at FULL, after 2 unmeasured. Link drain: section 9's link (%s ms round trip, 2 Mbit/s), window %d, structured mode over MQTT 5, "+
		"a backlog of %s events copied onto the mount; the limit is section 9's; fsyncs are the relay's (`RelayStats.WALSyncs`). "+
		"At %s ms, the drain's backlog above (%s events whose padded payloads compress to almost nothing) over the same link in batches of up to 100 events, zstd: the time from Run's start to the last delivery.",
		thousands(int64(sz.flashSlowTx)), fmtDur(linkRTT), linkDayWindow, thousands(int64(n)), fmtDur(flashTargetDelay), thousands(int64(sz.flashDrain)))
	return nil
}

// flashSet records a case's figures under flash_<key>_.
func (r *runner) flashSet(key string, f flashFigures) {
	p := "flash_" + key + "_"
	r.rep.set(p+"events", f.events)
	r.rep.set(p+"bytes_per_event", f.bytes)
	r.rep.set(p+"page_bytes_per_event", f.pageBytes)
	r.rep.set(p+"fsyncs_per_1000", f.perK)
	r.progress("  %s: %.0f B written per event, %.0f B of pages written back, %.2f fsyncs per 1,000 events (-shm: %.1f B per event)",
		key, f.bytes, f.pageBytes, f.perK, f.shmBytes)
}

// flashEnqueue commits n orders with their events, one per transaction,
// on the mount, after warmup unmeasured, and counts what they wrote.
func (r *runner) flashEnqueue(ctx context.Context, pfs *powerfs.FS, name string, sync outbox.Synchronous, warmup, n int) (flashFigures, error) {
	ob, err := r.openBenchAt(ctx, filepath.Join(pfs.Mountpoint(), name), sync)
	if err != nil {
		return flashFigures{}, err
	}
	defer ob.Close()
	if _, err := commitOrders(ctx, ob, 1, 1+warmup); err != nil {
		return flashFigures{}, err
	}
	before, err := pfs.Counts()
	if err != nil {
		return flashFigures{}, err
	}
	start := time.Now()
	if _, err := commitOrders(ctx, ob, 1+warmup, 1+warmup+n); err != nil {
		return flashFigures{}, err
	}
	took := time.Since(start)
	after, err := pfs.Counts()
	if err != nil {
		return flashFigures{}, err
	}
	f := flashUse(before, after, name, n)
	f.txPerS = float64(n) / took.Seconds()
	return f, nil
}

// flashDrain drains a copy of the template on the mount to the broker and
// counts what the relay wrote: marks, checkpoints, the purge of the sent
// rows and the reclaiming of their pages.
// The copy is made in the backing directory, behind the mount: durable
// already, and not counted.
func (r *runner) flashDrain(ctx context.Context, pfs *powerfs.FS, backing string, b *mochiBroker, tmpl string, d flashDrainCase) (flashFigures, error) {
	name := "flash-" + d.key + ".db"
	if err := copyDB(tmpl, filepath.Join(backing, name)); err != nil {
		return flashFigures{}, err
	}
	ob, err := outbox.Open(ctx, filepath.Join(pfs.Mountpoint(), name), outbox.Options{Logger: r.log, ReserveBytes: -1})
	if err != nil {
		return flashFigures{}, err
	}
	defer ob.Close()
	st, err := ob.Stats(ctx)
	if err != nil {
		return flashFigures{}, err
	}
	n := int(st.Pending)
	tr := newOrderTracker(n)
	b.setHandler(eachEvent(tr.handle))
	defer b.setHandler(nil)
	before, err := pfs.Counts()
	if err != nil {
		return flashFigures{}, err
	}
	opts := d.opts
	opts.Retention, opts.PurgeInterval = -1, 200*time.Millisecond
	stop, relay, err := r.startRelay(ctx, ob, b, publishTimes{}, opts)
	if err != nil {
		return flashFigures{}, err
	}
	werr := tr.wait(ctx, drainTimeout(n, 64))
	if werr == nil {
		werr = waitPending(ctx, ob, 0, 30*time.Second)
	}
	if werr == nil {
		werr = waitPurged(ctx, ob, 30*time.Second)
	}
	rst, serr := relay.Stats(ctx)
	if err := stop(); err != nil && werr == nil {
		werr = err
	}
	if werr == nil {
		werr = serr
	}
	if werr != nil {
		return flashFigures{}, werr
	}
	tr.mu.Lock()
	dups, disorder := tr.dups, tr.disorder
	tr.mu.Unlock()
	if dups > 0 || disorder > 0 {
		return flashFigures{}, fmt.Errorf("%d duplicates, %d out of order", dups, disorder)
	}
	after, err := pfs.Counts()
	if err != nil {
		return flashFigures{}, err
	}
	f := flashUse(before, after, name, n)
	f.relaySyncsPerK = float64(rst.WALSyncs) * 1000 / float64(n)
	return f, nil
}

// eachEvent hands each event of a message to handle: the message itself,
// or each document of a structured batch, decompressed first where its
// magic bytes say so (the wire format of docs/batching.md, as MQTT 3.1.1
// tells it). A message it cannot read is handed on as it is, for the
// tracker not to count.
func eachEvent(handle func(topic string, payload []byte)) func(string, []byte) {
	return func(topic string, payload []byte) {
		if alg := compress.Sniff(payload); alg != compress.None {
			b, err := compress.Decompress(alg, payload, outbox.MaxBatchBytesLimit)
			if err != nil {
				handle(topic, payload)
				return
			}
			payload = b
		}
		var docs []json.RawMessage
		if len(payload) == 0 || payload[0] != '[' || json.Unmarshal(payload, &docs) != nil {
			handle(topic, payload)
			return
		}
		for _, d := range docs {
			handle(topic, d)
		}
	}
}

// waitPurged waits until no sent row is kept and the free pages are given
// back (fewer than the 64 the relay's purge leaves).
func waitPurged(ctx context.Context, ob *outbox.Outbox, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		st, err := ob.Stats(ctx)
		if err != nil {
			return err
		}
		var free int64
		if err := ob.DB().QueryRowContext(ctx, `PRAGMA freelist_count`).Scan(&free); err != nil {
			return err
		}
		if st.Sent == 0 && free < 64 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d sent rows kept and %d free pages after %s", st.Sent, free, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// openBenchAt is openBench for a file anywhere.
func (r *runner) openBenchAt(ctx context.Context, path string, sync outbox.Synchronous) (*outbox.Outbox, error) {
	ob, err := outbox.Open(ctx, path, outbox.Options{Synchronous: sync, Logger: r.log, ReserveBytes: -1})
	if err != nil {
		return nil, err
	}
	if _, err := ob.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL, total_cents INTEGER NOT NULL)`); err != nil {
		ob.Close()
		return nil, err
	}
	return ob, nil
}
