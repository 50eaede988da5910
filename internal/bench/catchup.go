package bench

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/edgeoutbox/outbox"
)

// catchup: a backlog built while the broker was away, new orders arriving
// at a steady rate all along; the broker comes back. How long until the
// backlog is gone, and what the draining does to the orders' transactions.
func (r *runner) catchup(ctx context.Context) error {
	sz := r.sz
	ob, err := r.openBench(ctx, "catchup.db", outbox.SyncFull)
	if err != nil {
		return err
	}
	defer ob.Close()
	r.progress("  writing a backlog of %d messages", sz.catchBacklog)
	const perTx = 5000
	for i := 0; i < sz.catchBacklog; {
		msgs := make([]outbox.Message, 0, perTx)
		for ; i < sz.catchBacklog && len(msgs) < perTx; i++ {
			msgs = append(msgs, outbox.Message{Topic: benchTopic, Type: benchType, Payload: payload(i, payloadLen)})
		}
		if err := ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }); err != nil {
			return err
		}
	}
	b, err := newMochi()
	if err != nil {
		return err
	}
	defer b.close()

	// The orders: one transaction each (an order row and its event), at a
	// steady rate, timed from BEGIN to the end of COMMIT.
	var mu sync.Mutex
	var lat []time.Duration
	var phase int // 0: outage, 1: catching up, 2: done
	var idle, busy []time.Duration
	wctx, stopWriter := context.WithCancel(ctx)
	defer stopWriter()
	writerDone := make(chan error, 1)
	n := sz.catchBacklog
	go func() {
		writerDone <- pace(wctx, 1<<30, sz.catchRate, func(int) error {
			n++
			i := n
			t := time.Now()
			err := ob.Transact(wctx, func(tx *sql.Tx) error {
				if err := insertOrder(wctx, tx, i); err != nil {
					return err
				}
				return ob.Enqueue(wctx, tx, outbox.Message{Topic: benchTopic, Type: benchType, Payload: payload(i, payloadLen)})
			})
			if err != nil {
				return err
			}
			d := time.Since(t)
			mu.Lock()
			switch phase {
			case 0:
				idle = append(idle, d)
			case 1:
				busy = append(busy, d)
			}
			mu.Unlock()
			return nil
		})
	}()
	// The outage goes on for a while with orders arriving.
	outage := max(time.Second, time.Duration(sz.catchBacklog/sz.catchRate/10)*time.Second)
	select {
	case <-time.After(outage):
	case err := <-writerDone:
		return fmt.Errorf("orders: %w", err)
	}
	// The broker is back: everything committed up to now is the backlog.
	mu.Lock()
	phase = 1
	mu.Unlock()
	var backlog int64
	if err := ob.DB().QueryRowContext(ctx, `SELECT max(seq) FROM outbox`).Scan(&backlog); err != nil {
		return err
	}
	tr := newOrderTracker(int(backlog))
	b.setHandler(tr.handle)
	t0 := time.Now()
	stop, _, err := r.startRelay(ctx, ob, b, publishTimes{}, outbox.RelayOptions{})
	if err != nil {
		return err
	}
	werr := tr.wait(ctx, time.Duration(backlog)*time.Millisecond+60*time.Second)
	mu.Lock()
	phase = 2
	lat = busy
	mu.Unlock()
	elapsed := tr.last.Sub(t0)
	stopWriter()
	if err := <-writerDone; err != nil && wctx.Err() == nil {
		stop()
		return fmt.Errorf("orders: %w", err)
	}
	if err := stop(); err != nil {
		return err
	}
	if werr != nil {
		return werr
	}
	id, bs := summarize(idle), summarize(lat)
	r.rep.set("catchup_backlog", int(backlog))
	r.rep.set("catchup_rate_per_s", sz.catchRate)
	r.rep.set("catchup_seconds", elapsed.Seconds())
	r.rep.set("catchup_drain_msgs_per_s", float64(backlog)/elapsed.Seconds())
	r.rep.set("catchup_enqueue_idle_p50_ms", id.P50)
	r.rep.set("catchup_enqueue_idle_p99_ms", id.P99)
	r.rep.set("catchup_enqueue_p50_ms", bs.P50)
	r.rep.set("catchup_enqueue_p99_ms", bs.P99)
	r.rep.set("catchup_enqueue_max_ms", bs.Max)
	r.rep.set("catchup_orders_achieved_per_s", float64(len(lat))/elapsed.Seconds())
	r.progress("  backlog %d gone in %.2f s; orders: idle %s, during catch-up %s", backlog, elapsed.Seconds(), id, bs)
	scale := ""
	if r.cfg.Mode != Full {
		scale = " (" + string(r.cfg.Mode) + "; --full builds 100,000)"
	}
	r.rep.note(4, "%s messages pending%s when the broker comes back (written before, then %s of outage with orders arriving), new orders at %d/s all along, "+
		"each one transaction (order row + Enqueue, `Transact`, synchronous FULL), timed from BEGIN to the end of COMMIT. "+
		"Gone: the last message committed before the broker came back is delivered. Relay defaults (window 64, batches of 256).",
		thousands(backlog), scale, outage, sz.catchRate)
	return nil
}
