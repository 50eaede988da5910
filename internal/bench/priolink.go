package bench

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/edgeoutbox/outbox"
)

// Priority 9 after an outage (section 9): a backlog of priority 0 waits
// for the link, a priority-9 event is committed, and the time from the
// relay's CONNACK to that event's delivery is set beside what the link
// allows: it may wait for a window already sent (its bytes ahead of it on
// the link) and a round trip for a slot, no more.

// prioBatch is the batching of the batched case: the order events' size
// of batch, the other settings their defaults.
var prioBatch = outbox.BatchOptions{MaxEvents: orderBatchEvents}

// prioCases are the ways the backlog goes: one event a message, and in
// batches.
var prioCases = []struct {
	key, name string
	opts      outbox.RelayOptions
}{
	{"unbatched", "one event a message", outbox.RelayOptions{}},
	{"batched", fmt.Sprintf("batched (MaxEvents %d)", orderBatchEvents), outbox.RelayOptions{Batch: prioBatch}},
}

// prioWhens are when the priority-9 event is committed: as the relay gets
// its CONNACK (the backlog's first window may already be on its way), or
// during the outage (the relay's first read after connecting finds it).
var prioWhens = []struct{ key, name string }{
	{"connack", "committed at the CONNACK"},
	{"outage", "committed during the outage"},
}

// prioBound is the most a priority-9 event may wait after the CONNACK:
// two round trips and the transmission time of window messages of
// messageBytes on the link.
func prioBound(window int, messageBytes float64) time.Duration {
	return 2*linkRTT + time.Duration(float64(window)*messageBytes/linkRate*float64(time.Second))
}

// prioWatch is a subscriber's view of one run: the backlog's events in
// commit order, and the priority-9 event (sequence n+1).
type prioWatch struct {
	mu       sync.Mutex
	n        int64
	seen     map[int64]bool
	last     int64 // the newest priority-0 event delivered
	disorder int
	ahead    int       // priority-0 events first delivered before the priority-9 one
	at       time.Time // the priority-9 event's first delivery
	done     chan struct{}
}

func (w *prioWatch) handle(_ string, payload []byte) {
	now := time.Now()
	seq := parseSeqOrN(payload)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case seq == w.n+1 && w.at.IsZero():
		w.at = now
		close(w.done)
	case seq < 1 || seq > w.n || w.seen[seq]:
	default:
		w.seen[seq] = true
		if w.at.IsZero() {
			w.ahead++
		}
		if seq < w.last {
			w.disorder++
		}
		w.last = max(w.last, seq)
	}
}

// prioRun is one run's result.
type prioRun struct {
	delay  time.Duration // the relay's CONNACK → the priority-9 event at the broker
	ahead  int
	window int // effective
}

// linkPriority measures priority 9 after an outage, each case and each
// moment of commit, beside the bound; unbatched is the bytes per event of
// one event a message (structured, MQTT 5).
func (r *runner) linkPriority(ctx context.Context, b *mochiBroker, unbatched linkBytes) error {
	n := r.sz.linkPrioBacklog
	enc := linkEncodingOf("structured5")
	r.rep.set("link_prio_backlog", n)
	padded := make([][]byte, r.sz.linkBytesEvents)
	for i := range padded {
		padded[i] = payload(i+1, payloadLen)
	}
	batched, err := r.linkBytesOfPayloads(ctx, b, "link-prio-bytes.db", enc, outbox.RelayOptions{Batch: prioBatch}, padded)
	if err != nil {
		return fmt.Errorf("batched bytes: %w", err)
	}
	r.progress("  writing a backlog of %d messages of priority 0", n)
	tmpl, err := r.makeBacklog(ctx, fmt.Sprintf("link-prio-%d.db", n), n)
	if err != nil {
		return err
	}
	for _, c := range prioCases {
		// Bytes up per message of the backlog: a batch is as full as
		// MaxEvents (the backlog is longer than a batch).
		msgBytes := unbatched.publish
		if c.opts.Batch.MaxEvents > 1 {
			msgBytes = batched.publish * float64(min(c.opts.Batch.MaxEvents, n))
		}
		p := "link_prio_" + c.key + "_"
		r.rep.set(p+"message_bytes", msgBytes)
		for _, w := range prioWhens {
			res, err := r.linkPrioRun(ctx, b, tmpl, n, enc, linkDayWindow, c.opts, w.key == "outage")
			if err != nil {
				return fmt.Errorf("priority 9 after an outage, %s, %s: %w", c.key, w.key, err)
			}
			// A window, or the whole backlog if it is less.
			msgs := n
			if c.opts.Batch.MaxEvents > 1 {
				msgs = (n + c.opts.Batch.MaxEvents - 1) / c.opts.Batch.MaxEvents
			}
			bound := prioBound(min(res.window, msgs), msgBytes)
			r.rep.set(p+"bound_ms", ms(bound))
			q := p + w.key + "_"
			r.rep.set(q+"ms", ms(res.delay))
			r.rep.set(q+"ahead", res.ahead)
			r.rep.set(q+"vs_bound", res.delay.Seconds()/bound.Seconds())
			r.rep.check(q+"vs_bound", res.delay <= bound)
			r.progress("  priority 9 after %d of priority 0, %s, %s: %s after the CONNACK, %d events ahead of it; bound %s",
				n, c.key, w.key, res.delay.Round(time.Millisecond), res.ahead, bound.Round(time.Millisecond))
		}
	}
	r.rep.note(9, "Priority 9 after an outage: %s events of priority 0 (as the drains above) wait while the link is down, the relay (window %d, structured, MQTT 5) "+
		"trying to connect; the link comes back and a priority-9 event is committed as the relay reports its CONNACK (`RelayMetrics.Since`), or before the link comes back. "+
		"Delay: the CONNACK → the event's first delivery at a subscriber inside the broker. Bound: 2 round trips + the effective window (or the whole backlog, if less) × the bytes up of one "+
		"priority-0 message / the bandwidth (a window sent before the event was read is ahead of it on the link). Ahead: priority-0 events delivered first; "+
		"they come in commit order (checked). Batched: MaxEvents %d, no MaxDelay, MaxBytes its default; a message's bytes are those per event over %s batched events × %d. "+
		"Without priorities the event waits for the whole backlog (the day offline above).",
		thousands(int64(n)), linkDayWindow, prioBatch.MaxEvents, thousands(int64(len(padded))), prioBatch.MaxEvents)
	return nil
}

// linkPrioRun runs one case over the shaped link: a copy of the template,
// the link down until the relay has tried to connect, then up; the
// priority-9 event committed during the outage, or as the relay reports
// its CONNACK.
func (r *runner) linkPrioRun(ctx context.Context, b *mochiBroker, tmpl string, n int, enc linkEncoding, window int, opts outbox.RelayOptions, inOutage bool) (prioRun, error) {
	p, err := newShapedLink(b)
	if err != nil {
		return prioRun{}, err
	}
	defer p.Close()
	p.Down()
	path := filepath.Join(r.dir, "link-prio-run.db")
	if err := copyDB(tmpl, path); err != nil {
		return prioRun{}, err
	}
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: r.log, ReserveBytes: -1})
	if err != nil {
		return prioRun{}, err
	}
	defer ob.Close()
	w := &prioWatch{n: int64(n), seen: make(map[int64]bool, n), done: make(chan struct{})}
	b.setHandler(eachEvent(w.handle))
	defer b.setHandler(nil)
	stop, relay, pub, err := r.linkRelay(ctx, ob, p.URL(), enc, window, opts)
	if err != nil {
		return prioRun{}, err
	}
	defer stop()
	commit := func() error {
		m := outbox.Message{Topic: benchTopic, Type: benchType, Payload: payload(n+1, payloadLen), Priority: 9}
		return ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, m) })
	}
	if err := waitFor(ctx, 10*time.Second, "a connection attempt", func() bool { return relay.Metrics().ConnectionAttempts > 0 }); err != nil {
		return prioRun{}, err
	}
	if inOutage {
		if err := commit(); err != nil {
			return prioRun{}, err
		}
	}
	if err := p.Up(); err != nil {
		return prioRun{}, err
	}
	var m outbox.RelayMetrics
	if err := waitFor(ctx, 10*time.Second, "the CONNACK", func() bool { m = relay.Metrics(); return m.Connected }); err != nil {
		return prioRun{}, err
	}
	if !inOutage {
		if err := commit(); err != nil {
			return prioRun{}, err
		}
	}
	// Without priorities it comes after the backlog: about as long as
	// the backlog's drain.
	if err := waitDone(ctx, w.done, 30*time.Second+time.Duration(n)*5*time.Millisecond, func() error {
		return fmt.Errorf("the priority-9 event not delivered")
	}); err != nil {
		return prioRun{}, err
	}
	eff := window
	if rm := pub.MaxInFlight(); rm > 0 && rm < eff {
		eff = rm
	}
	if err := stop(); err != nil {
		return prioRun{}, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.disorder > 0 {
		return prioRun{}, fmt.Errorf("%d events of priority 0 out of commit order", w.disorder)
	}
	return prioRun{delay: w.at.Sub(m.Since), ahead: w.ahead, window: eff}, nil
}

// waitFor polls cond every millisecond until it holds, ctx ends or
// timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s within %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}
