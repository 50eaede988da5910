package bench

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/edgeoutbox/outbox"
)

// durable: what durable before publish costs. The relay fsyncs the WAL
// after each batch it reads and before publishing it, so that no event the
// broker has can be undone by a power cut; a backlog is read in batches of
// 256, a trickle one event at a time. The relay without that fsync cannot
// be run through the public API (and must not be): BenchmarkRelayDrain's
// nosync variant gives the figure before.
func (r *runner) durable(ctx context.Context) error {
	sz := r.sz
	b, err := newMochi()
	if err != nil {
		return err
	}
	defer b.close()
	r.rep.set("durable_backlog_events", sz.durBacklog)
	r.rep.set("durable_trickle_events", sz.durTrickle)
	for _, mode := range []struct {
		key      string
		syncMode outbox.Synchronous
	}{{"full", outbox.SyncFull}, {"normal", outbox.SyncNormal}} {
		p := "durable_" + mode.key + "_"
		rate, perK, markPerK, err := r.durableBacklog(ctx, b, mode.key, mode.syncMode)
		if err != nil {
			return fmt.Errorf("%s backlog: %w", mode.key, err)
		}
		r.rep.set(p+"backlog_msgs_per_s", rate)
		r.rep.set(p+"backlog_fsyncs_per_1000", perK)
		r.rep.set(p+"backlog_mark_fsyncs_per_1000", markPerK)
		// At most one per batch read: 1,000 / 256 rounded up, for the
		// sizes of every mode.
		r.rep.check(p+"backlog_fsyncs_per_1000", perK <= 4)
		perEvent, puback, err := r.durableTrickle(ctx, b, mode.key, mode.syncMode)
		if err != nil {
			return fmt.Errorf("%s trickle: %w", mode.key, err)
		}
		r.rep.set(p+"trickle_fsyncs_per_event", perEvent)
		r.rep.check(p+"trickle_fsyncs_per_event", perEvent <= 1)
		r.rep.set(p+"trickle_puback_p50_ms", puback.P50)
		r.rep.set(p+"trickle_puback_p99_ms", puback.P99)
		r.progress("  %s: backlog %.0f msg/s, %.2f fsyncs per 1,000 for the batch reads and %.2f for the marks; trickle %.2f fsyncs per event, commit → PUBACK %s",
			mode.key, rate, perK, markPerK, perEvent, puback)
	}
	scale := ""
	if r.cfg.Mode != Full {
		scale = " (" + string(r.cfg.Mode) + "; --full uses 50,000 and 1,000)"
	}
	r.rep.note(8, "Backlog: %s events%s, one order row and its event per transaction (`Transact`), committed at FULL or NORMAL with no relay connected "+
		"(the broker away), then drained by a relay with the defaults (window 64, batches of 256) to the in-process broker; rate as in section 2, "+
		"from the start of Run to the last first delivery. Trickle: %s events on a fresh file, each committed once the previous one's PUBACK is back; "+
		"latency from the return of `Transact`. At FULL the batch reads need no fsync: `Transact`'s COMMIT synced its rows (a sidecar's or an application's own transaction would be synced). Fsyncs: `RelayStats.WALSyncs`, the fsyncs of the WAL the relay made, split into those of the batch reads (before publishing) and `RelayStats.MarkSyncs`, "+
		"those that keep its marks durable (so that a power cut duplicates no more than a crash). "+
		"The drain rate without that fsync cannot be measured through the public API: `go test -run '^$' -bench RelayDrain .` "+
		"(BenchmarkRelayDrain, durable and nosync, no broker) gives both; see BENCHMARKS.md.",
		thousands(int64(sz.durBacklog)), scale, thousands(int64(sz.durTrickle)))
	return nil
}

// commitOrders commits events from..to-1, one order and its event per
// transaction, and returns when each commit returned.
func commitOrders(ctx context.Context, ob *outbox.Outbox, from, to int) ([]time.Time, error) {
	at := make([]time.Time, 0, to-from)
	for i := from; i < to; i++ {
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			if err := insertOrder(ctx, tx, i); err != nil {
				return err
			}
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: benchTopic, Type: benchType, Payload: payload(i, payloadLen)})
		})
		if err != nil {
			return nil, err
		}
		at = append(at, time.Now())
	}
	return at, nil
}

// durableBacklog commits a backlog while no relay runs, drains it and
// returns the rate and the WAL fsyncs per 1,000 events, for the batch
// reads and for the marks.
func (r *runner) durableBacklog(ctx context.Context, b broker, name string, syncMode outbox.Synchronous) (rate, perK, markPerK float64, err error) {
	n := r.sz.durBacklog
	ob, err := r.openBench(ctx, "durable-backlog-"+name+".db", syncMode)
	if err != nil {
		return 0, 0, 0, err
	}
	defer ob.Close()
	r.progress("  %s: committing %d events, one per transaction, no relay", name, n)
	if _, err := commitOrders(ctx, ob, 1, n+1); err != nil {
		return 0, 0, 0, err
	}
	tr := newOrderTracker(n)
	b.setHandler(tr.handle)
	defer b.setHandler(nil)
	start := time.Now()
	stop, relay, err := r.startRelay(ctx, ob, b, publishTimes{}, outbox.RelayOptions{})
	if err != nil {
		return 0, 0, 0, err
	}
	werr := tr.wait(ctx, drainTimeout(n, 64))
	if werr == nil {
		werr = waitPending(ctx, ob, 0, 30*time.Second)
	}
	st, serr := relay.Stats(ctx)
	if err := stop(); err != nil && werr == nil {
		werr = err
	}
	if werr == nil {
		werr = serr
	}
	if werr != nil {
		return 0, 0, 0, werr
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	perK = float64(st.WALSyncs-st.MarkSyncs) * 1000 / float64(n)
	return float64(n) / tr.last.Sub(start).Seconds(), perK, float64(st.MarkSyncs) * 1000 / float64(n), nil
}

// durableTrickle commits events one at a time, each once the previous one
// is acknowledged, and returns the WAL fsyncs per event and commit → PUBACK.
func (r *runner) durableTrickle(ctx context.Context, b broker, name string, syncMode outbox.Synchronous) (perEvent float64, puback dist, err error) {
	n := r.sz.durTrickle
	const warmup = 20
	ob, err := r.openBench(ctx, "durable-trickle-"+name+".db", syncMode)
	if err != nil {
		return 0, dist{}, err
	}
	defer ob.Close()
	tr := newLatTracker(n)
	b.setHandler(tr.deliver)
	defer b.setHandler(nil)
	// Each event is acknowledged once (no reconnection on loopback); the
	// buffer holds them all, so the publisher never waits on it.
	acked := make(chan int, n+warmup)
	onAck := func(i int, at time.Time) {
		tr.ack(i, at)
		select {
		case acked <- i:
		default:
		}
	}
	start, relay, err := r.startRelay(ctx, ob, b, publishTimes{acked: onAck}, outbox.RelayOptions{})
	if err != nil {
		return 0, dist{}, err
	}
	stop := sync.OnceValue(start) // its second call would wait forever
	defer stop()
	if err := waitConnected(ctx, relay); err != nil {
		return 0, dist{}, err
	}
	one := func(i int) (time.Time, error) {
		at, err := commitOrders(ctx, ob, i, i+1)
		if err != nil {
			return time.Time{}, err
		}
		timeout := time.After(10 * time.Second)
		for {
			select {
			case got := <-acked:
				if got == i {
					return at[0], nil
				}
			case <-timeout:
				return time.Time{}, fmt.Errorf("event %d: no PUBACK within 10 s", i)
			case <-ctx.Done():
				return time.Time{}, ctx.Err()
			}
		}
	}
	// Warm-up: events outside the tracked range.
	for i := 0; i < warmup; i++ {
		if _, err := one(n + i); err != nil {
			return 0, dist{}, err
		}
	}
	st0, err := relay.Stats(ctx)
	if err != nil {
		return 0, dist{}, err
	}
	for i := 0; i < n; i++ {
		at, err := one(i)
		if err != nil {
			return 0, dist{}, err
		}
		tr.mu.Lock()
		tr.commit[i] = at.UnixNano()
		tr.mu.Unlock()
	}
	st1, err := relay.Stats(ctx)
	if err != nil {
		return 0, dist{}, err
	}
	if err := tr.wait(ctx, 30*time.Second); err != nil {
		return 0, dist{}, err
	}
	if err := stop(); err != nil {
		return 0, dist{}, err
	}
	puback, _ = tr.dists()
	return float64(st1.WALSyncs-st0.WALSyncs) / float64(n), puback, nil
}
