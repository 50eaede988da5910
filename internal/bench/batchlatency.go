package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeoutbox/outbox/compression"

	"github.com/edgeoutbox/outbox"
)

// latencyBatchCases are section 3's cases of batching online, with no
// MaxDelay: a batch holds only what is already pending, so it should add
// nothing to an event's latency.
var latencyBatchCases = []orderWire{
	{"off", "batching off", outbox.RelayOptions{}},
	{"on", "batching on (100 events, no MaxDelay)", outbox.RelayOptions{Batch: orderBatch}},
	{"zstd", "batching on, zstd", outbox.RelayOptions{Batch: orderBatch, Compress: compression.Zstd()}},
}

const (
	// latencyBatchWarmup is the events each relay publishes before the
	// rounds.
	latencyBatchWarmup = 50
	// latencyBatchRound is the events of a round: a few, so that a burst
	// of other work on the machine, tens of milliseconds long, falls on
	// rounds of every case.
	latencyBatchRound = 10
)

// orderTimedPublisher notes when each order event of a message is
// published and acknowledged, a batch's events all at their message's
// times, for the round's tracker; the numbers are read once the PUBACK is
// in, off the relay's path.
type orderTimedPublisher struct {
	*outbox.MQTTPublisher
	tr       atomic.Pointer[latTracker]
	u        *unpacker
	messages atomic.Int64
}

func (p *orderTimedPublisher) Publish(topic string, payload []byte) outbox.Token {
	return p.PublishWithProperties(topic, payload, outbox.PublishProperties{})
}

// PublishWithProperties is what the relay calls with MQTT 5 properties (a
// Content Type, a content-encoding).
func (p *orderTimedPublisher) PublishWithProperties(topic string, payload []byte, props outbox.PublishProperties) outbox.Token {
	at := time.Now()
	kept := append([]byte(nil), payload...) // the relay may reuse its buffer once acknowledged
	tok := p.MQTTPublisher.PublishWithProperties(topic, payload, props)
	p.messages.Add(1)
	tr := p.tr.Load()
	if tr == nil {
		return tok
	}
	go func() {
		<-tok.Done()
		acked := time.Now()
		for _, n := range p.u.orders(kept) {
			tr.publishing(n, at)
			if tok.Error() == nil {
				tr.ack(n, acked)
			}
		}
	}()
	return tok
}

// batchRelay is one case's outbox and its relay, running for all the
// rounds.
type batchRelay struct {
	ob    *outbox.Outbox
	relay *outbox.Relay
	tp    *orderTimedPublisher
	stop  func() error
}

// latencyBatching measures commit → PUBACK and commit → subscriber of
// order events with batching off and on: a relay for each case, all
// connected, and short rounds taking turns, so that the moods of a shared
// machine fall on every case alike.
func (r *runner) latencyBatching(ctx context.Context, b broker) error {
	sz := r.sz
	per, rounds := latencyBatchRound, max(sz.latN/latencyBatchRound, 2)
	payloads := orderPayloads(0, per+latencyBatchWarmup)
	bk := brokerKey(b)
	u, err := newUnpacker()
	if err != nil {
		return err
	}
	defer u.close()
	relays := map[string]*batchRelay{}
	defer func() {
		for _, br := range relays {
			br.stop()
			br.ob.Close()
		}
	}()
	for _, c := range latencyBatchCases {
		br, err := r.startBatchRelay(ctx, b, c, u)
		if err != nil {
			return fmt.Errorf("%s: %w", c.key, err)
		}
		relays[c.key] = br
		for i, p := range payloads[per:] {
			if _, err := commitOrder(ctx, br.ob, per+i, p); err != nil {
				return err
			}
		}
		if err := waitPending(ctx, br.ob, 0, 10*time.Second); err != nil {
			return err
		}
	}
	type acc struct{ puback, delivered []time.Duration }
	accs := map[string]*acc{}
	for round := 0; round < rounds; round++ {
		cases := latencyBatchCases
		if round%2 == 1 {
			cases = []orderWire{cases[2], cases[1], cases[0]}
		}
		for _, c := range cases {
			tr := newLatTracker(per)
			if err := r.latencyBatchRound(ctx, b, relays[c.key], tr, u, payloads[:per]); err != nil {
				return fmt.Errorf("%s, round %d: %w", c.key, round+1, err)
			}
			a, d := tr.samples()
			if accs[c.key] == nil {
				accs[c.key] = &acc{}
			}
			accs[c.key].puback = append(accs[c.key].puback, a...)
			accs[c.key].delivered = append(accs[c.key].delivered, d...)
		}
	}
	r.rep.set("latency_batch_rounds", rounds)
	r.rep.set("latency_batch_events", per*rounds)
	p99 := map[string]float64{}
	for _, c := range latencyBatchCases {
		x := accs[c.key]
		a, d := summarize(x.puback), summarize(x.delivered)
		p := fmt.Sprintf("latency_batch_%s_%s_", c.key, bk)
		r.setQuantiles(p+"puback_", a)
		r.setQuantiles(p+"delivered_", d)
		events := latencyBatchWarmup + per*rounds
		perMsg := float64(events) / float64(max(relays[c.key].tp.messages.Load(), 1))
		r.rep.set(p+"events_per_message", perMsg)
		p99[c.key] = a.P99
		r.progress("  %s %s: commit → PUBACK %s; → subscriber %s; %.2f events a message", bk, c.name, a, d, perMsg)
	}
	for _, k := range []string{"on", "zstd"} {
		key := fmt.Sprintf("latency_batch_%s_vs_off_%s_puback_p99", k, bk)
		ratio := p99[k] / p99["off"]
		r.rep.set(key, ratio)
		if k == "on" {
			r.rep.check(key, ratio <= 1.10)
		}
	}
	r.rep.note(3, "Batching online (to mochi): order events (section 9's) committed one per transaction at %d/s, with `Transact` at FULL as above, "+
		"to three outboxes, each drained by a relay of its own, all connected throughout: batching off, on (at most %d events a message, no MaxDelay) and on with zstd; "+
		"%s rounds of %d events, the cases taking turns (off, on, zstd, then the other way round), after %d events of warm-up each. "+
		"A batch's events have its message's PUBACK. The bench's subscriber reads every message (decompressing with one zstd decoder) in the broker's path before its PUBACK, as for the other cases.",
		sz.latRate, orderBatchEvents, thousands(int64(rounds)), per, latencyBatchWarmup)
	return nil
}

// startBatchRelay opens an outbox for case c and runs its relay, through
// an orderTimedPublisher, until stop.
func (r *runner) startBatchRelay(ctx context.Context, b broker, c orderWire, u *unpacker) (*batchRelay, error) {
	ob, err := r.openBench(ctx, "latency-batch-"+c.key+".db", outbox.SyncFull)
	if err != nil {
		return nil, err
	}
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: b.url(), ClientID: "bench-batch-" + c.key + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)})
	if err != nil {
		ob.Close()
		return nil, err
	}
	tp := &orderTimedPublisher{MQTTPublisher: pub, u: u}
	opts := c.opts
	opts.Source = benchSource
	relay, err := ob.NewRelay(tp, opts)
	if err != nil {
		pub.Close()
		ob.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	br := &batchRelay{ob: ob, relay: relay, tp: tp, stop: sync.OnceValue(func() error {
		cancel()
		err := <-done
		pub.Close()
		return err
	})}
	if err := waitConnected(ctx, relay); err != nil {
		br.stop()
		ob.Close()
		return nil, err
	}
	return br, nil
}

// commitOrder commits an order row and its event in one transaction and
// returns when COMMIT returned.
func commitOrder(ctx context.Context, ob *outbox.Outbox, n int, p []byte) (time.Time, error) {
	err := ob.Transact(ctx, func(tx *sql.Tx) error {
		if err := insertOrder(ctx, tx, n); err != nil {
			return err
		}
		return ob.Enqueue(ctx, tx, outbox.Message{Topic: benchTopic, Type: benchType, Payload: p})
	})
	return time.Now(), err
}

// latencyBatchRound commits the tracked events to br's outbox at section
// 3's rate and waits until each is acknowledged and delivered.
func (r *runner) latencyBatchRound(ctx context.Context, b broker, br *batchRelay, tr *latTracker, u *unpacker, tracked [][]byte) error {
	b.setHandler(func(_ string, p []byte) {
		now := time.Now()
		for _, n := range u.orders(p) {
			tr.mark(tr.delivered, n, now)
		}
	})
	defer b.setHandler(nil)
	br.tp.tr.Store(tr)
	defer br.tp.tr.Store(nil)
	err := pace(ctx, len(tracked), r.sz.latRate, func(i int) error {
		at, err := commitOrder(ctx, br.ob, i, tracked[i])
		tr.mu.Lock()
		tr.commit[i] = at.UnixNano()
		tr.mu.Unlock()
		return err
	})
	if err != nil {
		return err
	}
	return tr.wait(ctx, 30*time.Second)
}
