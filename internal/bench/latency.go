package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/edgeoutbox/outbox"
)

// latTracker records, per event number, when its transaction committed,
// when its PUBACK came back and when the subscriber got it.
type latTracker struct {
	mu        sync.Mutex
	commit    []int64 // Unix ns; 0: not yet
	published []int64 // when the relay called Publish (not for raw paho)
	puback    []int64
	delivered []int64
	pending   int // events not yet both acknowledged and delivered
	done      chan struct{}
}

func newLatTracker(n int) *latTracker {
	return &latTracker{commit: make([]int64, n), published: make([]int64, n), puback: make([]int64, n), delivered: make([]int64, n), pending: 2 * n, done: make(chan struct{})}
}

func (t *latTracker) mark(list []int64, n int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n < 0 || n >= len(list) || list[n] != 0 {
		return
	}
	list[n] = at.UnixNano()
	t.pending--
	if t.pending == 0 {
		close(t.done)
	}
}

func (t *latTracker) deliver(_ string, payload []byte) {
	t.mark(t.delivered, parseN(payload), time.Now())
}

func (t *latTracker) ack(n int, at time.Time) { t.mark(t.puback, n, at) }

// publishing notes when the relay called Publish for event n (the first
// time: a resend after a reconnection keeps the first).
func (t *latTracker) publishing(n int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n >= 0 && n < len(t.published) && t.published[n] == 0 {
		t.published[n] = at.UnixNano()
	}
}

func (t *latTracker) wait(ctx context.Context, timeout time.Duration) error {
	return waitDone(ctx, t.done, timeout, func() error {
		t.mu.Lock()
		defer t.mu.Unlock()
		return fmt.Errorf("%d acknowledgements or deliveries still missing after %s", t.pending, timeout)
	})
}

// dists returns commit → PUBACK and commit → delivered.
func (t *latTracker) dists() (puback, delivered dist) {
	a, d := t.samples()
	return summarize(a), summarize(d)
}

// samples returns each event's commit → PUBACK and commit → delivered.
func (t *latTracker) samples() (puback, delivered []time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var a, d []time.Duration
	for i, c := range t.commit {
		if c == 0 {
			continue
		}
		if t.puback[i] != 0 {
			a = append(a, time.Duration(max(0, t.puback[i]-c)))
		}
		if t.delivered[i] != 0 {
			d = append(d, time.Duration(max(0, t.delivered[i]-c)))
		}
	}
	return a, d
}

// legs splits commit → PUBACK at the relay's call to Publish: noticing,
// reading and encoding the event, then the broker's round trip through the
// relay's client (what raw paho's figure is whole).
func (t *latTracker) legs() (toPublish, toPuback dist) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var a, b []time.Duration
	for i, c := range t.commit {
		if c == 0 || t.published[i] == 0 || t.puback[i] == 0 {
			continue
		}
		a = append(a, time.Duration(max(0, t.published[i]-c)))
		b = append(b, time.Duration(max(0, t.puback[i]-t.published[i])))
	}
	return summarize(a), summarize(b)
}

// publishTimes are told, by event number, when the relay calls Publish and
// when the PUBACK came; either may be nil.
type publishTimes struct {
	published, acked func(n int, at time.Time)
}

// timedPublisher notes when each event is published and acknowledged. It
// hands the relay the MQTT publisher's own token, so the relay waits for
// nothing more.
type timedPublisher struct {
	*outbox.MQTTPublisher
	times publishTimes
}

func (p *timedPublisher) Publish(topic string, payload []byte) outbox.Token {
	return p.PublishWithProperties(topic, payload, outbox.PublishProperties{})
}

// PublishWithProperties is what the relay calls for a message with MQTT 5
// properties (structured mode over 5 has a Content Type): without it the
// embedded publisher's would be called, and nothing noted.
func (p *timedPublisher) PublishWithProperties(topic string, payload []byte, props outbox.PublishProperties) outbox.Token {
	n := parseN(payload)
	if p.times.published != nil {
		p.times.published(n, time.Now())
	}
	tok := p.MQTTPublisher.PublishWithProperties(topic, payload, props)
	if p.times.acked != nil {
		go func() {
			<-tok.Done()
			if tok.Error() == nil {
				p.times.acked(n, time.Now())
			}
		}()
	}
	return tok
}

// startRelay runs a relay on ob to b, through a timedPublisher if times
// asks for any.
func (r *runner) startRelay(ctx context.Context, ob *outbox.Outbox, b broker, times publishTimes, opts outbox.RelayOptions) (stop func() error, relay *outbox.Relay, err error) {
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: b.url(), ClientID: "bench-relay-" + strconv.FormatInt(time.Now().UnixNano(), 36)})
	if err != nil {
		return nil, nil, err
	}
	var p outbox.Publisher = pub
	if times.published != nil || times.acked != nil {
		p = &timedPublisher{MQTTPublisher: pub, times: times}
	}
	opts.Source = benchSource
	relay, err = ob.NewRelay(p, opts)
	if err != nil {
		pub.Close()
		return nil, nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	stop = func() error {
		cancel()
		err := <-done
		pub.Close()
		return err
	}
	return stop, relay, nil
}

// startTrackedRelay has tr told of b's deliveries and of the PUBACKs of a
// relay it starts on ob with opts, and returns once that relay is
// connected; stop stops the relay, then the deliveries to tr.
func (r *runner) startTrackedRelay(ctx context.Context, ob *outbox.Outbox, b broker, tr *latTracker, opts outbox.RelayOptions) (stop func(), relay *outbox.Relay, err error) {
	b.setHandler(tr.deliver)
	stopRelay, relay, err := r.startRelay(ctx, ob, b, publishTimes{published: tr.publishing, acked: tr.ack}, opts)
	if err != nil {
		b.setHandler(nil)
		return nil, nil, err
	}
	stop = func() {
		stopRelay()
		b.setHandler(nil)
	}
	if err := waitConnected(ctx, relay); err != nil {
		stop()
		return nil, nil, err
	}
	return stop, relay, nil
}

// waitConnected waits until the relay is connected.
func waitConnected(ctx context.Context, relay *outbox.Relay) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := relay.Stats(ctx)
		if err == nil && st.Connected {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("relay not connected after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pace calls fn(i) for i in [0, n) at rate per second, on a fixed
// schedule (a late call is not made up for by skipping).
func pace(ctx context.Context, n, rate int, fn func(i int) error) error {
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; i < n; i++ {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := fn(i); err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) latency(ctx context.Context) error {
	sz := r.sz
	bs, closeBrokers, err := r.brokers()
	if err != nil {
		return err
	}
	defer closeBrokers()
	r.rep.set("latency_events", sz.latN)
	r.rep.set("latency_rate_per_s", sz.latRate)
	for _, b := range bs {
		bk := brokerKey(b)
		for _, c := range []string{"raw", "library", "sidecar", "sidecar_full"} {
			tr := newLatTracker(sz.latN)
			var err error
			switch c {
			case "raw":
				err = r.latencyRaw(ctx, b, tr)
			case "library":
				err = r.latencyLibrary(ctx, b, tr)
			default:
				err = r.latencySidecar(ctx, b, tr, c)
			}
			if err != nil {
				return fmt.Errorf("%s %s: %w", bk, c, err)
			}
			a, d := tr.dists()
			for _, x := range []struct {
				what string
				d    dist
			}{{"puback", a}, {"delivered", d}} {
				p := fmt.Sprintf("latency_%s_%s_%s_", c, bk, x.what)
				r.setQuantiles(p, x.d)
				r.rep.set(p+"max_ms", x.d.Max)
				if c != "raw" {
					r.rep.check(p+"p99_ms", x.d.P99 <= 5)
				}
			}
			legs := ""
			if c != "raw" {
				toPublish, toPuback := tr.legs()
				for _, x := range []struct {
					what string
					d    dist
				}{{"to_publish", toPublish}, {"publish_to_puback", toPuback}} {
					r.setQuantiles(fmt.Sprintf("latency_%s_%s_%s_", c, bk, x.what), x.d)
				}
				legs = fmt.Sprintf(" (p50 / p99: to Publish %s / %s, Publish → PUBACK %s / %s)", fmtMS(toPublish.P50), fmtMS(toPublish.P99), fmtMS(toPuback.P50), fmtMS(toPuback.P99))
			}
			r.progress("  %s %s: commit → PUBACK %s%s; → subscriber %s", bk, c, a, legs, d)
		}
	}
	scale := ""
	if r.cfg.Mode != Full {
		scale = " (" + string(r.cfg.Mode) + "; --full commits 10,000)"
	}
	r.rep.note(3, "%s events per case%s committed one per transaction at %d/s (synchronous FULL, the default) while the relay is connected (window 64). "+
		"Latency is measured from the return of COMMIT (a FULL commit's fsync is not counted). Library: `Transact` (at FULL its rows need no fsync of the relay's before publishing: its COMMIT synced them). "+
		"Sidecar: another process (`outboxlab bench child writer`) inserts order and outbox rows with plain SQL at synchronous=FULL; the relay notices them by watching the WAL (inotify and SQLite's WAL index; `PRAGMA data_version` where it cannot), and, not knowing the writer's level, fsyncs the WAL before publishing them; "+
		"declared (`RelayOptions.WritersAtFull`, `outboxctl relay --writers-full`), it publishes them with no fsync first. "+
		"Raw paho, the floor: the same payloads published at the same rate by paho alone (MQTT 3.1.1, no database), from the call to `Publish`: what the broker, the client and this machine's scheduling cost before any outbox. "+
		"For the relay's cases commit → PUBACK is also split at the relay's call to `Publish`: noticing, reading and encoding the event, then the broker's round trip through the relay's client (raw paho's figure is that leg alone).",
		thousands(int64(sz.latN)), scale, sz.latRate)
	if err := r.latencyBatching(ctx, bs[0]); err != nil {
		return fmt.Errorf("batching: %w", err)
	}
	return nil
}

// setQuantiles reports d's p50 and p99 under the keys prefix+"p50_ms" and
// prefix+"p99_ms".
func (r *runner) setQuantiles(prefix string, d dist) {
	r.rep.set(prefix+"p50_ms", d.P50)
	r.rep.set(prefix+"p99_ms", d.P99)
}

// latencyRaw publishes the payloads with paho alone at the same rate as the
// commits of the other cases, each from the call to Publish: the floor.
func (r *runner) latencyRaw(ctx context.Context, b broker, tr *latTracker) error {
	b.setHandler(tr.deliver)
	defer b.setHandler(nil)
	c, err := rawClient(b.url(), "bench-raw-latency")
	if err != nil {
		return err
	}
	defer c.Disconnect(0)
	var acks sync.WaitGroup
	defer acks.Wait()
	publish := func(n int) time.Time {
		at := time.Now()
		tok := c.Publish(benchTopic, 1, false, payload(n, payloadLen))
		acks.Add(1)
		go func() {
			defer acks.Done()
			if tok.WaitTimeout(30*time.Second) && tok.Error() == nil {
				tr.ack(n, time.Now())
			}
		}()
		return at
	}
	// Warm-up: events outside the tracked range, delivered before the
	// tracked ones start.
	warm := newLatTracker(50)
	b.setHandler(warm.deliver)
	for i := 0; i < 50; i++ {
		tok := c.Publish(benchTopic, 1, false, payload(i, payloadLen))
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			return fmt.Errorf("raw warm-up publish: %v", tok.Error())
		}
		warm.ack(i, time.Now())
	}
	if err := warm.wait(ctx, 10*time.Second); err != nil {
		return err
	}
	b.setHandler(tr.deliver)
	err = pace(ctx, len(tr.commit), r.sz.latRate, func(i int) error {
		at := publish(i)
		tr.mu.Lock()
		tr.commit[i] = at.UnixNano()
		tr.mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	return tr.wait(ctx, 30*time.Second)
}

func (r *runner) latencyLibrary(ctx context.Context, b broker, tr *latTracker) error {
	ob, err := r.openBench(ctx, "latency-lib-"+brokerKey(b)+".db", outbox.SyncFull)
	if err != nil {
		return err
	}
	defer ob.Close()
	stop, _, err := r.startTrackedRelay(ctx, ob, b, tr, outbox.RelayOptions{})
	if err != nil {
		return err
	}
	defer stop()
	commit := func(n int) (time.Time, error) {
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			if err := insertOrder(ctx, tx, n); err != nil {
				return err
			}
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: benchTopic, Type: benchType, Payload: payload(n, payloadLen)})
		})
		// Taken after Transact's Notify too: a few µs late, never early.
		return time.Now(), err
	}
	// Warm-up: events outside the tracked range.
	for i := 0; i < 50; i++ {
		if _, err := commit(len(tr.commit) + i); err != nil {
			return err
		}
	}
	if err := waitPending(ctx, ob, 0, 10*time.Second); err != nil {
		return err
	}
	err = pace(ctx, len(tr.commit), r.sz.latRate, func(i int) error {
		at, err := commit(i)
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

// latencySidecar has another process insert the rows with plain SQL at
// FULL (SQLite's default); for the case "sidecar_full" the relay is told so
// (RelayOptions.WritersAtFull), and publishes with no fsync first.
func (r *runner) latencySidecar(ctx context.Context, b broker, tr *latTracker, c string) error {
	writersFull := c == "sidecar_full"
	path := filepath.Join(r.dir, "latency-"+c+"-"+brokerKey(b)+".db")
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: r.log, ReserveBytes: -1})
	if err != nil {
		return err
	}
	defer ob.Close()
	if _, err := ob.DB().ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL, total_cents INTEGER NOT NULL)`); err != nil {
		return err
	}
	stop, relay, err := r.startTrackedRelay(ctx, ob, b, tr, outbox.RelayOptions{WritersAtFull: writersFull})
	if err != nil {
		return err
	}
	defer stop()
	args := append(append([]string{}, r.cfg.Self[1:]...), "writer", "--db", path,
		"--n", strconv.Itoa(len(tr.commit)), "--rate", strconv.Itoa(r.sz.latRate), "--warmup", "50")
	cmd := exec.CommandContext(ctx, r.cfg.Self[0], args...)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return fmt.Errorf("writer process: %v: %s", err, ee.Stderr)
		}
		return fmt.Errorf("writer process: %w", err)
	}
	var res writerResult
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("writer process output: %w", err)
	}
	if len(res.Commits) != len(tr.commit) {
		return fmt.Errorf("writer process committed %d of %d", len(res.Commits), len(tr.commit))
	}
	tr.mu.Lock()
	copy(tr.commit, res.Commits)
	tr.mu.Unlock()
	if err := tr.wait(ctx, 30*time.Second); err != nil {
		return err
	}
	// The fsyncs the relay made before publishing, per event (the 50 of
	// the warm-up counted in): one per batch read undeclared, none declared.
	st, err := relay.Stats(ctx)
	if err != nil {
		return err
	}
	r.rep.set("latency_"+c+"_"+brokerKey(b)+"_fsyncs_per_event", float64(st.WALSyncs-st.MarkSyncs)/float64(len(tr.commit)+50))
	return nil
}

// writerResult is what the writer process prints: the commit times (Unix
// ns) of events 0..n-1.
type writerResult struct {
	Commits []int64 `json:"commits"`
}
