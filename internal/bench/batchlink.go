package bench

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"time"

	"github.com/edgeoutbox/outbox/compression"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/compress"
)

// orderWire is one way the relay sends the order events: batched or not,
// compressed or not (its options besides the window, source and envelope).
type orderWire struct {
	key, name string
	opts      outbox.RelayOptions
}

var orderBatch = outbox.BatchOptions{MaxEvents: orderBatchEvents}

var orderWires = []orderWire{
	{"unbatched", "one event a message (before batching)", outbox.RelayOptions{}},
	{"zstd", "one event a message, zstd", outbox.RelayOptions{Compress: compression.Zstd()}},
	{"batched", "batched", outbox.RelayOptions{Batch: orderBatch}},
	{"batched_zstd", "batched, zstd", outbox.RelayOptions{Batch: orderBatch, Compress: compression.Zstd()}},
	{"batched_gzip", "batched, gzip", outbox.RelayOptions{Batch: orderBatch, Compress: compression.Gzip()}},
}

// orderDayWires are the ways the day of order events drains.
var orderDayWires = []string{"batched_zstd", "unbatched"}

func orderWireOf(key string) orderWire {
	for _, w := range orderWires {
		if w.key == key {
			return w
		}
	}
	panic("bench: no order wire " + key)
}

// linkOrders measures the order events on the link, each way of sending
// them in the same run: the bytes per event, compression's CPU cost, and
// the day offline drained batched with zstd beside one event a message.
func (r *runner) linkOrders(ctx context.Context, b *mochiBroker) error {
	sz := r.sz
	enc := linkEncodingOf("structured5")
	day := orderPayloads(1, linkDayEvents)
	r.rep.set("link_orders_payload_mean_bytes", meanLen(day))

	bytesOf := map[string]linkBytes{}
	for _, w := range orderWires {
		lb, err := r.linkBytesOfPayloads(ctx, b, "link-orders-bytes-"+w.key+".db", enc, w.opts, day[:sz.linkOrdersBytesEvents])
		if err != nil {
			return fmt.Errorf("order events' bytes, %s: %w", w.key, err)
		}
		bytesOf[w.key] = lb
		p := "link_orders_" + w.key + "_"
		r.rep.set(p+"payload", lb.payload)
		r.rep.set(p+"events_per_message", lb.perMessage)
		r.rep.set(p+"publish", lb.publish)
		r.rep.set(p+"puback", lb.puback)
		r.rep.set(p+"bytes", lb.publish+lb.puback)
		r.progress("  order events, %s: %.1f B per event (up %.1f, down %.1f), %.1f events a message of %d B",
			w.key, lb.publish+lb.puback, lb.publish, lb.puback, lb.perMessage, lb.payload)
	}
	u := bytesOf["unbatched"]
	for _, k := range []string{"batched_zstd", "batched_gzip"} {
		x := bytesOf[k]
		ratio := (x.publish + x.puback) / (u.publish + u.puback)
		r.rep.set("link_orders_"+k+"_vs_unbatched", ratio)
		if k == "batched_zstd" {
			r.rep.check("link_orders_batched_zstd_vs_unbatched", ratio <= 0.25)
		}
	}

	batches := orderBatches(20, orderBatchEvents)
	for _, alg := range []compress.Alg{compress.Zstd, compress.Gzip} {
		per, ratio, err := compressCost(alg, batches, orderBatchEvents, sz.compressTime)
		if err != nil {
			return err
		}
		r.rep.set("compress_"+alg.String()+"_ns_per_event", float64(per.Nanoseconds()))
		r.rep.set("compress_"+alg.String()+"_ratio", ratio)
		r.progress("  %s: %s per event, %.3f of the batch", alg, per, ratio)
	}

	r.rep.set("link_orders_day_events", linkDayEvents)
	tmpls := map[int]string{}
	for _, k := range orderDayWires {
		w, lb := orderWireOf(k), bytesOf[k]
		limit, _ := lb.limit(linkDayWindow)
		whole := k == "batched_zstd" && sz.linkOrdersDay || k == "unbatched" && sz.linkDay
		n := linkDayEvents
		if !whole {
			n = min(linkDayEvents, max(int(math.Ceil(limit*sz.linkDrainSeconds)), 4*linkDayWindow))
		}
		tmpl, ok := tmpls[n]
		if !ok {
			r.progress("  writing a backlog of %d order events", n)
			var err error
			tmpl, err = r.makeBacklogOf(ctx, fmt.Sprintf("link-orders-%d.db", n), n, func(i int) []byte { return day[i-1] })
			if err != nil {
				return err
			}
			tmpls[n] = tmpl
		}
		path := filepath.Join(r.dir, "link-run.db")
		res, err := r.linkDrainAt(ctx, b, tmpl, path, path, n, enc, linkDayWindow, w.opts)
		if err != nil {
			return fmt.Errorf("the day of order events, %s: %w", k, err)
		}
		p := "link_orders_day_" + k + "_"
		r.rep.set(p+"drained", n)
		r.rep.set(p+"limit_seconds", linkDayEvents/limit)
		r.rep.set(p+"events_per_s", res.rate)
		r.rep.set(p+"events_per_message", float64(n)/float64(max(res.messages, 1)))
		r.rep.set(p+"seconds_estimated", res.first.Seconds()+linkDayEvents/res.rate)
		if whole {
			r.rep.set(p+"seconds", res.total.Seconds())
			if k == "batched_zstd" {
				r.rep.check(p+"seconds", res.total.Seconds() <= 18)
			}
		}
		// linkDrainAt fails unless every event came once, in commit order.
		r.rep.set(p+"order_held", true)
		r.rep.check(p+"order_held", true)
		r.rep.set(p+"longest_gap_ms", ms(res.gap))
		r.rep.set(p+"fsyncs_per_1000", res.walSyncs)
		r.progress("  the day of order events, %s: %d events in %s (%.0f events/s, %.1f a message), longest gap %s, %.1f fsyncs per 1,000; every event once, in order",
			k, n, res.total.Round(100*time.Millisecond), res.rate, float64(n)/float64(max(res.messages, 1)), res.gap.Round(time.Millisecond), res.walSyncs)
	}
	est := func(k string) any {
		if v := r.rep.Value("link_orders_day_" + k + "_seconds"); v != nil {
			return v
		}
		return r.rep.Value("link_orders_day_" + k + "_seconds_estimated")
	}
	if z, ok := est("batched_zstd").(float64); ok {
		if u, ok := est("unbatched").(float64); ok {
			r.rep.set("link_orders_day_batched_zstd_vs_unbatched", z/u)
		}
	}

	r.rep.note(9, "Order events (internal/bench/orders.go; BENCHMARKS.md shows one): a till's orders as JSON, an order number, the store, the till, the cashier, "+
		"one to three lines of an article number, a quantity and a price, and the total, made by a generator with a fixed seed (math/rand/v2's PCG), "+
		"%.1f B on average; the first %s of the day's for the bytes, in one transaction, counted like the padded ones above, structured mode over MQTT 5 at window %d. "+
		"Batched: at most %d events a message, no MaxDelay; zstd and gzip compress a batch, or alone an event of 256 B or more, where smaller. "+
		"Compression's cost: one compressor on one goroutine (as the relay has) compressing batches of %d order events as the relay encodes them (a JSON array of CloudEvents documents), timed for %s; "+
		"`go test -bench CompressOrderBatch ./internal/bench` is the same, and runs under qemu for arm64 (BENCHMARKS.md). "+
		"The day: the %s order events drained over the link at window %d, each way; a subscriber inside the broker decompresses and unbatches each message and checks every event arrives once, in commit order.",
		meanLen(day), thousands(int64(sz.linkOrdersBytesEvents)), 64, orderBatchEvents, orderBatchEvents, sz.compressTime,
		thousands(linkDayEvents), linkDayWindow)
	if !sz.linkOrdersDay || !sz.linkDay {
		r.rep.note(9, "The day of order events is drained whole batched with zstd in quick and full mode, one event a message only with `--full`; "+
			"otherwise estimated from a drain of the first events (about %s s at the link's limit): its time to first delivery + 30,000 / its rate.", fmt.Sprint(sz.linkDrainSeconds))
	}
	return nil
}
