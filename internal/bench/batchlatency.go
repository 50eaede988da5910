package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/edgeoutbox/outbox"
)

// latencyBatchCases are section 3's cases of batching online, with no
// MaxDelay: a batch holds only what is already pending, so it should add
// nothing to an event's latency.
var latencyBatchCases = []orderWire{
	{"off", "batching off", linkBatching{}},
	{"on", "batching on (100 events, no MaxDelay)", linkBatching{batch: outbox.BatchOptions{MaxEvents: orderBatchEvents}}},
	{"zstd", "batching on, zstd", linkBatching{batch: outbox.BatchOptions{MaxEvents: orderBatchEvents}, compress: outbox.CompressZstd}},
}

// latencyBatchWarmup is the events committed before each round's.
const latencyBatchWarmup = 50

// orderTimedPublisher notes when each order event of a message is
// published and acknowledged, a batch's events all at their message's
// times; the numbers are read once the PUBACK is in, off the relay's
// path.
type orderTimedPublisher struct {
	*outbox.MQTTPublisher
	tr       *latTracker
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
	go func() {
		<-tok.Done()
		acked := time.Now()
		for _, n := range p.u.orders(kept) {
			p.tr.publishing(n, at)
			if tok.Error() == nil {
				p.tr.ack(n, acked)
			}
		}
	}()
	return tok
}

// latencyBatching measures commit → PUBACK and commit → subscriber of
// order events with batching off and on, in rounds taking turns, so that
// the machine's moods fall on every case alike.
func (r *runner) latencyBatching(ctx context.Context, b broker) error {
	sz := r.sz
	per := max(sz.latN/sz.latBatchRounds, 1)
	payloads := orderPayloads(0, per+latencyBatchWarmup)
	bk := brokerKey(b)
	type acc struct {
		puback, delivered []time.Duration
		events, messages  int64
	}
	accs := map[string]*acc{}
	obs := map[string]*outbox.Outbox{}
	defer func() {
		for _, ob := range obs {
			ob.Close()
		}
	}()
	for _, c := range latencyBatchCases {
		ob, err := r.openBench(ctx, "latency-batch-"+c.key+".db", outbox.SyncFull)
		if err != nil {
			return err
		}
		obs[c.key] = ob
		accs[c.key] = &acc{}
	}
	for round := 0; round < sz.latBatchRounds; round++ {
		cases := latencyBatchCases
		if round%2 == 1 {
			cases = []orderWire{cases[2], cases[1], cases[0]}
		}
		for _, c := range cases {
			tr := newLatTracker(per)
			msgs, err := r.latencyBatchRound(ctx, obs[c.key], b, tr, c.bt, payloads)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", c.key, round+1, err)
			}
			a, d := tr.samples()
			x := accs[c.key]
			x.puback = append(x.puback, a...)
			x.delivered = append(x.delivered, d...)
			x.events += int64(per + latencyBatchWarmup)
			x.messages += msgs
		}
	}
	r.rep.set("latency_batch_rounds", sz.latBatchRounds)
	r.rep.set("latency_batch_events", per*sz.latBatchRounds)
	p99 := map[string]float64{}
	for _, c := range latencyBatchCases {
		x := accs[c.key]
		a, d := summarize(x.puback), summarize(x.delivered)
		p := fmt.Sprintf("latency_batch_%s_%s_", c.key, bk)
		r.setQuantiles(p+"puback_", a)
		r.setQuantiles(p+"delivered_", d)
		perMsg := float64(x.events) / float64(max(x.messages, 1))
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
		"by a relay with batching off, on (at most %d events a message, no MaxDelay) and on with zstd, in %d rounds of %s events each taking turns "+
		"(off, on, zstd, then the other way round), each round a relay of its own started after %d events of warm-up; each event's PUBACK is its message's.",
		sz.latRate, orderBatchEvents, sz.latBatchRounds, thousands(int64(per)), latencyBatchWarmup)
	return nil
}

// latencyBatchRound starts a relay on ob with bt, commits the warm-up
// events, then the tracked ones at section 3's rate, and returns the MQTT
// messages the relay published once every event is acknowledged and
// delivered.
func (r *runner) latencyBatchRound(ctx context.Context, ob *outbox.Outbox, b broker, tr *latTracker, bt linkBatching, payloads [][]byte) (int64, error) {
	per := len(tr.commit)
	u, err := newUnpacker()
	if err != nil {
		return 0, err
	}
	defer u.close()
	b.setHandler(func(_ string, p []byte) {
		now := time.Now()
		for _, n := range u.orders(p) {
			tr.mark(tr.delivered, n, now)
		}
	})
	defer b.setHandler(nil)
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: b.url(), ClientID: "bench-batch-" + strconv.FormatInt(time.Now().UnixNano(), 36)})
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	tp := &orderTimedPublisher{MQTTPublisher: pub, tr: tr, u: u}
	relay, err := ob.NewRelay(tp, outbox.RelayOptions{Source: benchSource, Batch: bt.batch, Compress: bt.compress})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	stop := func() error {
		cancel()
		return <-done
	}
	err = r.latencyBatchCommits(ctx, ob, relay, tr, payloads[:per], payloads[per:])
	if serr := stop(); err == nil {
		err = serr
	}
	return tp.messages.Load(), err
}

func (r *runner) latencyBatchCommits(ctx context.Context, ob *outbox.Outbox, relay *outbox.Relay, tr *latTracker, tracked, warmup [][]byte) error {
	if err := waitConnected(ctx, relay); err != nil {
		return err
	}
	commit := func(n int, p []byte) (time.Time, error) {
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			if err := insertOrder(ctx, tx, n); err != nil {
				return err
			}
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: benchTopic, Type: benchType, Payload: p})
		})
		return time.Now(), err
	}
	for i, p := range warmup {
		if _, err := commit(len(tracked)+i, p); err != nil {
			return err
		}
	}
	if err := waitPending(ctx, ob, 0, 10*time.Second); err != nil {
		return err
	}
	err := pace(ctx, len(tracked), r.sz.latRate, func(i int) error {
		at, err := commit(i, tracked[i])
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
