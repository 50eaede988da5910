package bench

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// The link profile: a cellular uplink of a device (section 9). The shaped
// proxy of the test harness carries it: every byte leaves at the rate and
// arrives the one-way latency later, in each direction, with as many bytes
// on the wire at once as the rate lets out within the latency.
const (
	linkOneWay = 75 * time.Millisecond
	linkRTT    = 2 * linkOneWay
	linkRate   = 250_000 // bytes per second each way: 2 Mbit/s
	// linkDayEvents is a busy till's day offline, in events of payloadLen
	// bytes.
	linkDayEvents = 30_000
	// linkDayWindow is the window the day drains with: the relay's
	// default.
	linkDayWindow = 64
)

// linkEncoding is one way an event goes on the wire.
type linkEncoding struct {
	key, name string
	proto     outbox.MQTTProtocol
	env       outbox.Envelope
}

var linkEncodings = []linkEncoding{
	{"structured311", "structured JSON over MQTT 3.1.1", outbox.Protocol311, outbox.EnvelopeCloudEvents},
	{"structured5", "structured JSON over MQTT 5 (Content Type)", outbox.Protocol5, outbox.EnvelopeCloudEvents},
	{"binary5", "binary mode over MQTT 5 (user properties)", outbox.Protocol5, outbox.EnvelopeCloudEventsBinary},
	{"raw311", "raw payload over MQTT 3.1.1 (what raw paho sends)", outbox.Protocol311, outbox.EnvelopeRaw},
}

func linkEncodingOf(key string) linkEncoding {
	for _, e := range linkEncodings {
		if e.key == key {
			return e
		}
	}
	panic("bench: no link encoding " + key)
}

// linkDrains are the drains over the link: the relay's defaults (MQTT 5
// on mochi, structured mode) at each window, then binary mode and raw at
// window 256, where the link's bandwidth is the limit and the bytes per
// event decide it.
var linkDrains = []struct {
	enc    string
	window int
}{
	{"structured5", 16}, {"structured5", 64}, {"structured5", 256},
	{"binary5", 256}, {"raw311", 256},
}

func linkDrainKey(enc string, window int) string {
	return fmt.Sprintf("link_drain_%s_w%d_", enc, window)
}

// linkBytes is what one event costs on the wire, in TCP payload bytes.
type linkBytes struct {
	payload         int     // the PUBLISH's payload: the envelope, or the data alone (the mean, rounded)
	payloadSizes    int     // how many sizes of payload there were
	publish, puback float64 // per event, each direction
	// perMessage is the mean number of events in one MQTT message.
	perMessage float64
}

// limit is the most events per second the link carries at window w: a
// window of messages per round trip, or what its bandwidth lets through in
// the direction that fills first.
func (b linkBytes) limit(w int) (rate float64, bound string) {
	byWindow := float64(w) * max(b.perMessage, 1) / linkRTT.Seconds()
	byBandwidth := linkRate / math.Max(b.publish, b.puback)
	if byWindow <= byBandwidth {
		return byWindow, "window"
	}
	return byBandwidth, "bandwidth"
}

func (r *runner) link(ctx context.Context) error {
	sz := r.sz
	b, err := newMochi()
	if err != nil {
		return err
	}
	defer b.close()
	r.rep.set("link_rtt_ms", ms(linkRTT))
	r.rep.set("link_bytes_per_s", linkRate)

	// 1. Bytes per event, through a plain proxy (the bytes are those of a
	// shaped one; only the time differs).
	bytesOf := map[string]linkBytes{}
	for _, enc := range linkEncodings {
		lb, err := r.linkBytesOf(ctx, b, "link-bytes-"+enc.key+".db", enc, sz.linkBytesEvents)
		if err != nil {
			return fmt.Errorf("bytes per event, %s: %w", enc.key, err)
		}
		bytesOf[enc.key] = lb
		p := "link_bytes_" + enc.key + "_"
		r.rep.set(p+"payload", lb.payload)
		r.rep.set(p+"publish", lb.publish)
		r.rep.set(p+"puback", lb.puback)
		r.progress("  %s: PUBLISH %.1f B (payload %d B), PUBACK %.1f B per event", enc.key, lb.publish, lb.payload, lb.puback)
	}

	// 2. Drains over the shaped link, each beside its limit.
	tmpls := map[int]string{}
	template := func(n int) (string, error) {
		if t, ok := tmpls[n]; ok {
			return t, nil
		}
		r.progress("  writing a backlog of %d messages", n)
		t, err := r.makeBacklog(ctx, fmt.Sprintf("link-%d.db", n), n)
		if err != nil {
			return "", err
		}
		tmpls[n] = t
		return t, nil
	}
	var dayRun *linkRun
	recvMax := 0
	for _, d := range linkDrains {
		if !sz.linkAllDrains && !(d.enc == "structured5" && d.window == linkDayWindow) {
			continue
		}
		lb := bytesOf[d.enc]
		limit, _ := lb.limit(d.window)
		n := max(int(math.Ceil(limit*sz.linkDrainSeconds)), 4*d.window)
		tmpl, err := template(n)
		if err != nil {
			return err
		}
		res, err := r.linkDrain(ctx, b, tmpl, n, linkEncodingOf(d.enc), d.window)
		if err != nil {
			return fmt.Errorf("link drain %s window %d: %w", d.enc, d.window, err)
		}
		limit, bound := lb.limit(res.window) // the broker's Receive Maximum may narrow it
		p := linkDrainKey(d.enc, d.window)
		r.rep.set(p+"events", n)
		r.rep.set(p+"window", res.window)
		r.rep.set(p+"limit_msgs_per_s", limit)
		r.rep.set(p+"bound", bound)
		r.rep.set(p+"msgs_per_s", res.rate)
		r.rep.set(p+"vs_limit", res.rate/limit)
		r.rep.check(p+"vs_limit", res.rate/limit >= 0.90)
		r.rep.set(p+"longest_gap_ms", ms(res.gap))
		r.rep.set(p+"fsyncs_per_1000", res.walSyncs)
		r.progress("  %s window %d (effective %d): %.0f msg/s, limit %.0f (%s): %.2f of it; first delivery after %s, longest gap %s, %.1f fsyncs per 1,000 (%.1f for the marks)",
			d.enc, d.window, res.window, res.rate, limit, bound, res.rate/limit, res.first.Round(time.Millisecond),
			res.gap.Round(time.Millisecond), res.walSyncs, res.markSyncs)
		if d.enc == "structured5" && d.window == linkDayWindow {
			dayRun = &res
		}
		recvMax = max(recvMax, res.recvMax)
	}

	// A backlog spread over priorities 0, 5 and 9, beside the same drain at
	// priority 0: where the link is the limit, priorities cost nothing.
	if err := r.linkSpread(ctx, b, bytesOf["structured5"], dayRun); err != nil {
		return err
	}

	// 3. The day offline: 30,000 events at the relay's defaults.
	day := bytesOf["structured5"]
	dayLimit, _ := day.limit(linkDayWindow)
	r.rep.set("link_day_events", linkDayEvents)
	r.rep.set("link_day_limit_seconds", linkDayEvents/dayLimit)
	if dayRun != nil {
		r.rep.set("link_day_seconds_estimated", dayRun.first.Seconds()+linkDayEvents/dayRun.rate)
	}
	if sz.linkDay {
		tmpl, err := template(linkDayEvents)
		if err != nil {
			return err
		}
		res, err := r.linkDrain(ctx, b, tmpl, linkDayEvents, linkEncodingOf("structured5"), linkDayWindow)
		if err != nil {
			return fmt.Errorf("the day offline: %w", err)
		}
		r.rep.set("link_day_seconds", res.total.Seconds())
		r.rep.set("link_day_msgs_per_s", res.rate)
		r.rep.set("link_day_vs_limit", res.rate/dayLimit)
		r.rep.check("link_day_vs_limit", res.rate/dayLimit >= 0.90)
		r.rep.set("link_day_longest_gap_ms", ms(res.gap))
		r.progress("  the day: %d events in %s (%.0f msg/s, %.2f of the limit); longest gap %s, %.1f fsyncs per 1,000 (%.1f for the marks)",
			linkDayEvents, res.total.Round(100*time.Millisecond), res.rate, res.rate/dayLimit, res.gap.Round(time.Millisecond), res.walSyncs, res.markSyncs)
	}

	s := bytesOf["structured311"]
	r.rep.note(9, "The link: the test harness's shaped proxy (`harness.LaunchShapedProxy` with `SetLatency`) between the relay and the in-process mochi: "+
		"%s ms each way (%s ms round trip) and %s bytes/s (2 Mbit/s) each way; a delay line, so that a window of messages is on the wire at once. "+
		"Bytes per event are the proxy's `Moved` counters (TCP payload: the MQTT packets, without TCP/IP headers, which a real link adds: about 40–60 B "+
		"per segment) over %s events committed in one transaction after the connection was up, divided by the events; "+
		"a PUBLISH is 1 byte of fixed header, %d of Remaining Length, 2 + %d of topic, 2 of packet id, on MQTT 5 a property length and the properties "+
		"(Content Type `application/cloudevents+json`: 31 B; binary mode: Content Type `application/json` and the six attributes as user properties), "+
		"then the payload (%d B of data; the structured envelope adds %d B of attributes around it). "+
		"Limit: min(window / RTT, bandwidth / bytes per event in the fuller direction); window is the effective one, narrowed by the broker's MQTT 5 Receive Maximum "+
		"(mochi's: %s). Rate: the least-squares slope of the count of first deliveries over time, at a subscriber inside the broker: the steady rate, "+
		"which neither the connection's start (the first delivery comes about a round trip and a half after Run: CONNECT/CONNACK, then the first PUBLISH's way up) "+
		"nor a window arriving in one burst per round trip skews. Every drain is checked for order and duplicates. "+
		"On MQTT 5 mochi copies a PUBLISH's user properties into its PUBACK (its default; `Compatibilities.NoInheritedPropertiesOnAck` turns that off): "+
		"hence binary mode's large PUBACK; the uplink still fills first.",
		fmtDur(linkOneWay), fmtDur(linkRTT), thousands(linkRate), thousands(int64(sz.linkBytesEvents)),
		varintSize(s.payload+2+len(benchTopic)+2), len(benchTopic), payloadLen, s.payload-payloadLen, recvMaxText(recvMax))
	day5 := "The day offline: %s events of %d B, drained by a relay with the defaults (window %d, structured mode, MQTT 5 on mochi); "
	if sz.linkDay {
		r.rep.note(9, day5+"measured whole, from Run's start to the last first delivery; the estimate beside it is from the shorter window-%d drain: its time to first delivery + events / its rate.",
			thousands(linkDayEvents), payloadLen, linkDayWindow, linkDayWindow)
	} else {
		r.rep.note(9, day5+"not drained whole in %s mode (`--full` does): estimated from the window-%d drain above, its time to first delivery + events / its rate.",
			thousands(linkDayEvents), payloadLen, linkDayWindow, r.cfg.Mode, linkDayWindow)
	}
	if !sz.linkAllDrains {
		r.rep.note(9, "%s mode drains only at window %d.", r.cfg.Mode, linkDayWindow)
	}
	if err := r.linkPriority(ctx, b, bytesOf["structured5"]); err != nil {
		return err
	}
	return r.linkOrders(ctx, b)
}

func fmtDur(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// varintSize is the size of n as an MQTT Variable Byte Integer.
func varintSize(n int) int {
	s := 1
	for ; n >= 128; n >>= 7 {
		s++
	}
	return s
}

// linkRelay starts a relay that publishes through url with enc; stop ends
// it and closes its publisher.
func (r *runner) linkRelay(ctx context.Context, ob *outbox.Outbox, url string, enc linkEncoding, window int, opts outbox.RelayOptions) (stop func() error, relay *outbox.Relay, pub *outbox.MQTTPublisher, err error) {
	pub, err = outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: url, ClientID: "bench-link-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		Protocol: enc.proto, Logger: r.log})
	if err != nil {
		return nil, nil, nil, err
	}
	opts.Window, opts.Source, opts.Envelope = window, benchSource, enc.env
	opts.Reconnect = outbox.Backoff{Initial: 50 * time.Millisecond, Max: time.Second}
	relay, err = ob.NewRelay(pub, opts)
	if err != nil {
		pub.Close()
		return nil, nil, nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	stop = sync.OnceValue(func() error {
		cancel()
		err := <-done
		pub.Close()
		return err
	})
	return stop, relay, pub, nil
}

// linkBytesOf counts the bytes that n events of payloadLen bytes take
// through a proxy once the relay's connection is up, in each direction,
// with a new database named db.
func (r *runner) linkBytesOf(ctx context.Context, b *mochiBroker, db string, enc linkEncoding, n int) (linkBytes, error) {
	padded := make([][]byte, n)
	for i := range padded {
		padded[i] = payload(i+1, payloadLen)
	}
	lb, err := r.linkBytesOfPayloads(ctx, b, db, enc, outbox.RelayOptions{}, padded)
	if err == nil && lb.payloadSizes != 1 {
		err = fmt.Errorf("payloads of %d different sizes", lb.payloadSizes)
	}
	return lb, err
}

// linkBytesOfPayloads is linkBytesOf for events of the payloads, committed
// in one transaction, and a relay with opts besides the window, source and
// envelope (batching, compression).
func (r *runner) linkBytesOfPayloads(ctx context.Context, b *mochiBroker, db string, enc linkEncoding, opts outbox.RelayOptions, payloads [][]byte) (linkBytes, error) {
	n := len(payloads)
	p, err := harness.LaunchFaultProxy(b.b.Addr())
	if err != nil {
		return linkBytes{}, err
	}
	defer p.Close()
	ob, err := r.openBench(ctx, db, outbox.SyncNormal)
	if err != nil {
		return linkBytes{}, err
	}
	defer ob.Close()
	tr := newOrderTracker(n)
	tr.seqOf = parseSeqOrN
	var mu sync.Mutex
	payloadLens := map[int]int{}
	each := eachEvent(tr.handle)
	b.setHandler(func(topic string, pl []byte) {
		mu.Lock()
		payloadLens[len(pl)]++
		mu.Unlock()
		each(topic, pl)
	})
	defer b.setHandler(nil)
	stop, relay, _, err := r.linkRelay(ctx, ob, p.URL(), enc, 64, opts)
	if err != nil {
		return linkBytes{}, err
	}
	defer stop()
	if err := waitConnected(ctx, relay); err != nil {
		return linkBytes{}, err
	}
	up0, down0 := p.Moved(harness.ToBroker), p.Moved(harness.ToClient)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: benchTopic, Type: benchType, Payload: payloads[i]}
	}
	if err := ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }); err != nil {
		return linkBytes{}, err
	}
	if err := tr.wait(ctx, 30*time.Second); err != nil {
		return linkBytes{}, err
	}
	// The PUBACKs have passed the proxy before the relay marks their rows.
	if err := waitPending(ctx, ob, 0, 30*time.Second); err != nil {
		return linkBytes{}, err
	}
	up, down := p.Moved(harness.ToBroker)-up0, p.Moved(harness.ToClient)-down0
	if err := stop(); err != nil {
		return linkBytes{}, err
	}
	if err := tr.faults(); err != nil {
		return linkBytes{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	lb := linkBytes{publish: float64(up) / float64(n), puback: float64(down) / float64(n), payloadSizes: len(payloadLens)}
	count, total := 0, 0
	for l, c := range payloadLens {
		count += c
		total += l * c
	}
	lb.payload = int(math.Round(float64(total) / float64(max(count, 1))))
	lb.perMessage = float64(n) / float64(max(count, 1))
	return lb, nil
}

// linkRun is one drain over the link.
type linkRun struct {
	events  int           // the backlog drained
	window  int           // effective: the broker's Receive Maximum may narrow it
	recvMax int           // the broker's Receive Maximum (MQTT 5; 0: none or 3.1.1)
	rate    float64       // deliveries per second: slope of the deliveries over time
	first   time.Duration // Run's start → first delivery
	total   time.Duration // Run's start → last first delivery
	gap     time.Duration // the longest pause between two deliveries
	// markSyncs and walSyncs are the relay's fsyncs of the WAL per 1,000
	// events: for its marks, and all of them.
	markSyncs, walSyncs float64
	// messages is the MQTT messages delivered (batched: each of many
	// events).
	messages int
}

// linkDrain drains a copy of the template over the shaped link.
func (r *runner) linkDrain(ctx context.Context, b *mochiBroker, tmpl string, n int, enc linkEncoding, window int) (linkRun, error) {
	path := filepath.Join(r.dir, "link-run.db")
	return r.linkDrainAt(ctx, b, tmpl, path, path, n, enc, window, outbox.RelayOptions{})
}

// linkSpread drains, at window 64, the events of the priority-0 drain
// there (one) spread over priorities 0, 5 and 9 (section 2's mix), order
// checked within each, and sets its rate beside the link's limit and
// one's.
func (r *runner) linkSpread(ctx context.Context, b *mochiBroker, lb linkBytes, one *linkRun) error {
	if one == nil {
		return nil
	}
	mix := drainPrioOf("mix")
	n := one.events
	tmpl, err := r.makeBacklogPrio(ctx, "link-spread.db", n, func(i int) []byte { return payload(i, payloadLen) },
		func(i int) int { return mix.of(int64(i)) })
	if err != nil {
		return err
	}
	path := filepath.Join(r.dir, "link-run.db")
	res, err := r.linkDrainPrio(ctx, b, tmpl, path, path, n, linkEncodingOf("structured5"), linkDayWindow, outbox.RelayOptions{}, mix.of)
	if err != nil {
		return fmt.Errorf("link drain spread over priorities: %w", err)
	}
	limit, _ := lb.limit(res.window)
	p := "link_drain_spread_structured5_w64_"
	r.rep.set(p+"events", n)
	r.rep.set(p+"msgs_per_s", res.rate)
	r.rep.set(p+"vs_limit", res.rate/limit)
	r.rep.check(p+"vs_limit", res.rate/limit >= 0.90)
	r.rep.set(p+"vs_one_priority", res.rate/one.rate)
	r.rep.check(p+"vs_one_priority", res.rate/one.rate >= 0.95)
	r.progress("  spread over priorities 0, 5, 9, window 64: %.0f msg/s, %.2f of the limit, %.2f of priority 0's", res.rate, res.rate/limit, res.rate/one.rate)
	return nil
}

// linkDrainAt is linkDrain with the copy made at copyTo and opened at
// path (the same file, seen through a mount of it: section 10), and the
// relay's options besides the window, source and envelope (batching).
func (r *runner) linkDrainAt(ctx context.Context, b *mochiBroker, tmpl, copyTo, path string, n int, enc linkEncoding, window int, opts outbox.RelayOptions) (linkRun, error) {
	return r.linkDrainPrio(ctx, b, tmpl, copyTo, path, n, enc, window, opts, nil)
}

// linkDrainPrio is linkDrainAt of a backlog whose event of sequence s has
// priority prioOf(s), order checked within each (nil: all 0).
func (r *runner) linkDrainPrio(ctx context.Context, b *mochiBroker, tmpl, copyTo, path string, n int, enc linkEncoding, window int, opts outbox.RelayOptions, prioOf func(int64) int) (linkRun, error) {
	p, err := newShapedLink(b)
	if err != nil {
		return linkRun{}, err
	}
	defer p.Close()
	if err := copyDB(tmpl, copyTo); err != nil {
		return linkRun{}, err
	}
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: r.log, ReserveBytes: -1})
	if err != nil {
		return linkRun{}, err
	}
	defer ob.Close()
	tr := newOrderTracker(n)
	tr.seqOf = parseSeqOrN
	tr.streamOf = prioOf
	tr.times = make([]time.Time, 0, n)
	var messages atomic.Int64
	each := eachEvent(tr.handle)
	b.setHandler(func(topic string, pl []byte) {
		messages.Add(1)
		each(topic, pl)
	})
	defer b.setHandler(nil)
	start := time.Now()
	stop, relay, pub, err := r.linkRelay(ctx, ob, p.URL(), enc, window, opts)
	if err != nil {
		return linkRun{}, err
	}
	defer stop()
	werr := tr.wait(ctx, 30*time.Second+time.Duration(n)*20*time.Millisecond)
	if werr == nil {
		werr = waitPending(ctx, ob, 0, 30*time.Second)
	}
	st, serr := relay.Stats(ctx)
	if werr == nil {
		werr = serr
	}
	eff, recvMax := window, pub.MaxInFlight()
	if recvMax > 0 && recvMax < eff {
		eff = recvMax
	}
	if err := stop(); err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return linkRun{}, werr
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.dups > 0 || tr.disorder > 0 {
		return linkRun{}, fmt.Errorf("%d duplicates, %d out of order", tr.dups, tr.disorder)
	}
	return linkRun{
		events:    n,
		messages:  int(messages.Load()),
		window:    eff,
		recvMax:   recvMax,
		rate:      slope(tr.times),
		first:     tr.first.Sub(start),
		total:     tr.last.Sub(start),
		gap:       longestGap(tr.times),
		markSyncs: float64(st.MarkSyncs) * 1000 / float64(n),
		walSyncs:  float64(st.WALSyncs) * 1000 / float64(n),
	}, nil
}

// newShapedLink starts the link profile's proxy in front of b.
func newShapedLink(b *mochiBroker) (*harness.FaultProxy, error) {
	p, err := harness.LaunchShapedProxy(b.b.Addr(), linkRate, linkRate)
	if err != nil {
		return nil, err
	}
	p.SetLatency(harness.ToBroker, linkOneWay)
	p.SetLatency(harness.ToClient, linkOneWay)
	return p, nil
}

// parseSeqOrN is the sequence of a structured envelope, or else the "n" of
// the payload (binary mode and raw carry the data alone; the backlogs'
// payloads carry their sequence number as n).
func parseSeqOrN(b []byte) int64 {
	if s := parseSeq(b); s >= 0 {
		return s
	}
	return int64(parseN(b))
}

// slope is the steady rate of a series of deliveries, in deliveries per
// second: the least-squares slope of their count over time. It is neither
// raised by the connection's start nor skewed by a window's deliveries
// coming in one burst per round trip: the middle of each burst lies on the
// line, where (count − 1) / (last − first) would miss one window.
func slope(times []time.Time) float64 {
	if len(times) < 2 {
		return math.NaN()
	}
	var sx, sy, sxx, sxy float64
	for i, t := range times {
		x := t.Sub(times[0]).Seconds()
		y := float64(i)
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
	}
	n := float64(len(times))
	return (n*sxy - sx*sy) / (n*sxx - sx*sx)
}

func recvMaxText(n int) string {
	if n == 0 {
		return "none"
	}
	return thousands(int64(n))
}

func longestGap(times []time.Time) time.Duration {
	var g time.Duration
	for i := 1; i < len(times); i++ {
		g = max(g, times[i].Sub(times[i-1]))
	}
	return g
}
