package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeoutbox/outbox"
)

// The articles' dispatcher (../shared/seeds, the .NET one in Persian, whose
// Russian and Chinese siblings differ only in constants), ported as it is:
//
//	using var timer = new PeriodicTimer(TimeSpan.FromSeconds(2));
//	while (await timer.WaitForNextTickAsync(ct)) {
//	    var batch = await db.OutboxMessages
//	        .Where(m => m.ProcessedAtUtc == null && m.Attempts < 10)
//	        .OrderBy(m => m.OccurredAtUtc).Take(50).ToListAsync(ct);
//	    foreach (var msg in batch) {
//	        try { await publisher.PublishAsync(msg.Id, msg.Type, msg.Payload, ct);
//	              msg.ProcessedAtUtc = DateTime.UtcNow; }
//	        catch (Exception ex) { msg.Attempts++; msg.LastError = ex.Message; }
//	    }
//	    await db.SaveChangesAsync(ct);
//	}
//
// The publisher publishes at QoS 1 and waits for the PUBACK; when it has no
// connection it tries to open one, and a failure throws (counted against
// the message, as every failure is).

const (
	articlesPoll      = 2 * time.Second
	articlesBatch     = 50
	articlesMaxTries  = 10
	articlesPubWait   = 5 * time.Second
	articlesTopicRoot = "bench/articles/orders"
	oursTopic         = "bench/ours/orders"
)

const articlesSchema = `
CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL, total_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS outbox_messages (
	id               TEXT PRIMARY KEY,
	type             TEXT NOT NULL,
	payload          BLOB NOT NULL,
	occurred_at_utc  INTEGER NOT NULL,
	processed_at_utc INTEGER,
	attempts         INTEGER NOT NULL DEFAULT 0,
	last_error       TEXT
);`

// articlesPublisher is the IEventPublisher: one paho client, connected on
// demand.
type articlesPublisher struct {
	url string
	c   mqtt.Client
}

func (p *articlesPublisher) publish(ctx context.Context, id, typ string, data []byte) error {
	if p.c == nil || !p.c.IsConnectionOpen() {
		if p.c != nil {
			p.c.Disconnect(0)
			p.c = nil
		}
		c, err := rawClient(p.url, "bench-articles")
		if err != nil {
			return err
		}
		p.c = c
	}
	msg := fmt.Appendf(nil, `{"id":%q,"type":%q,"data":%s}`, id, typ, data)
	tok := p.c.Publish(articlesTopicRoot, 1, false, msg)
	if !tok.WaitTimeout(articlesPubWait) {
		return errors.New("publish timed out")
	}
	return tok.Error()
}

func (p *articlesPublisher) close() {
	if p.c != nil {
		p.c.Disconnect(0)
	}
}

// articlesDispatcher runs the ported loop until ctx ends.
func articlesDispatcher(ctx context.Context, db *sql.DB, pub *articlesPublisher) error {
	timer := time.NewTicker(articlesPoll)
	defer timer.Stop()
	type msg struct {
		id, typ   string
		payload   []byte
		processed bool
		failed    bool
		err       string
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		rows, err := db.QueryContext(ctx, `SELECT id, type, payload FROM outbox_messages
			WHERE processed_at_utc IS NULL AND attempts < ? ORDER BY occurred_at_utc LIMIT ?`, articlesMaxTries, articlesBatch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		var batch []msg
		for rows.Next() {
			var m msg
			if err := rows.Scan(&m.id, &m.typ, &m.payload); err != nil {
				rows.Close()
				return err
			}
			batch = append(batch, m)
		}
		rows.Close()
		for i := range batch {
			if err := pub.publish(ctx, batch[i].id, batch[i].typ, batch[i].payload); err != nil {
				batch[i].failed, batch[i].err = true, err.Error()
			} else {
				batch[i].processed = true
			}
		}
		// SaveChangesAsync: one transaction for the whole batch.
		tx, err := db.BeginTx(context.Background(), nil)
		if err != nil {
			return err
		}
		now := time.Now().UnixNano()
		for _, m := range batch {
			switch {
			case m.processed:
				_, err = tx.Exec(`UPDATE outbox_messages SET processed_at_utc = ? WHERE id = ?`, now, m.id)
			case m.failed:
				_, err = tx.Exec(`UPDATE outbox_messages SET attempts = attempts + 1, last_error = ? WHERE id = ?`, m.err, m.id)
			}
			if err != nil {
				tx.Rollback()
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
}

// sideBySide runs ours and the articles' dispatcher on two files, fed by
// the same orders, to the same broker, and records what the subscriber got.
type sideBySide struct {
	r      *runner
	b      broker
	ours   *outbox.Outbox
	arts   *sql.DB
	pub    *articlesPublisher
	stops  []func() error
	oursT  *arrivals
	artsT  *arrivals
	relay  *outbox.Relay
	dispOK chan error
}

// arrivals records commits and first deliveries by event number.
type arrivals struct {
	mu        sync.Mutex
	commit    map[int]time.Time
	delivered map[int]time.Time
	dups      int
	disorder  int
	maxN      int
}

func newArrivals() *arrivals {
	return &arrivals{commit: map[int]time.Time{}, delivered: map[int]time.Time{}, maxN: -1}
}

func (a *arrivals) committed(n int, at time.Time) {
	a.mu.Lock()
	a.commit[n] = at
	a.mu.Unlock()
}

func (a *arrivals) deliver(n int) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.delivered[n]; ok {
		a.dups++
		return
	}
	a.delivered[n] = now
	if n < a.maxN {
		a.disorder++
	}
	a.maxN = max(a.maxN, n)
}

// latencies of the events committed in [from, to) that were delivered,
// and how many of them were.
func (a *arrivals) latencies(from, to time.Time) (dist, int, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ds []time.Duration
	committed := 0
	for n, c := range a.commit {
		if c.Before(from) || !c.Before(to) {
			continue
		}
		committed++
		if d, ok := a.delivered[n]; ok {
			ds = append(ds, max(0, d.Sub(c)))
		}
	}
	return summarize(ds), committed, len(ds)
}

func (a *arrivals) counts() (committed, delivered, dups, disorder int, last time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range a.delivered {
		if d.After(last) {
			last = d
		}
	}
	return len(a.commit), len(a.delivered), a.dups, a.disorder, last
}

func (r *runner) newSideBySide(ctx context.Context, b broker, name string) (*sideBySide, error) {
	s := &sideBySide{r: r, b: b, oursT: newArrivals(), artsT: newArrivals(), dispOK: make(chan error, 1)}
	var err error
	if s.ours, err = r.openBench(ctx, name+"-ours.db", outbox.SyncFull); err != nil {
		return nil, err
	}
	if s.arts, err = outbox.OpenDB(filepath.Join(r.dir, name+"-articles.db"), outbox.DBOptions{}); err != nil {
		s.ours.Close()
		return nil, err
	}
	if _, err := s.arts.ExecContext(ctx, articlesSchema); err != nil {
		s.close()
		return nil, err
	}
	b.setHandler(func(topic string, payload []byte) {
		switch topic {
		case oursTopic:
			s.oursT.deliver(parseN(payload))
		case articlesTopicRoot:
			s.artsT.deliver(parseN(payload))
		}
	})
	stop, relay, err := r.startRelay(ctx, s.ours, b, publishTimes{}, outbox.RelayOptions{
		// Retry a lost broker as often as the articles' loop does.
		Reconnect: outbox.Backoff{Initial: 100 * time.Millisecond, Max: articlesPoll},
	})
	if err != nil {
		s.close()
		return nil, err
	}
	s.stops = append(s.stops, stop)
	s.relay = relay
	s.pub = &articlesPublisher{url: b.url()}
	dctx, cancel := context.WithCancel(ctx)
	go func() { s.dispOK <- articlesDispatcher(dctx, s.arts, s.pub) }()
	s.stops = append(s.stops, func() error { cancel(); err := <-s.dispOK; s.pub.close(); return err })
	return s, waitConnected(ctx, relay)
}

func (s *sideBySide) close() error {
	var errs []error
	for _, stop := range s.stops {
		errs = append(errs, stop())
	}
	s.stops = nil
	s.b.setHandler(nil)
	if s.ours != nil {
		errs = append(errs, s.ours.Close())
	}
	if s.arts != nil {
		errs = append(errs, s.arts.Close())
	}
	return errors.Join(errs...)
}

// order commits order n into both outboxes, each in its own transaction.
func (s *sideBySide) order(ctx context.Context, n int) error {
	pl := payload(n, payloadLen)
	err := s.ours.Transact(ctx, func(tx *sql.Tx) error {
		if err := insertOrder(ctx, tx, n); err != nil {
			return err
		}
		return s.ours.Enqueue(ctx, tx, outbox.Message{Topic: oursTopic, Type: benchType, Payload: pl})
	})
	if err != nil {
		return err
	}
	s.oursT.committed(n, time.Now())
	tx, err := s.arts.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := insertOrder(ctx, tx, n); err != nil {
		tx.Rollback()
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO outbox_messages (id, type, payload, occurred_at_utc) VALUES (?, ?, ?, ?)`,
		outbox.NewID(), benchType, pl, time.Now().UnixNano()); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.artsT.committed(n, time.Now())
	return nil
}

func (s *sideBySide) articlesAttempts(ctx context.Context) (charged, abandoned int, err error) {
	err = s.arts.QueryRowContext(ctx, `SELECT coalesce(sum(attempts), 0), count(*) FILTER (WHERE processed_at_utc IS NULL AND attempts >= ?) FROM outbox_messages`,
		articlesMaxTries).Scan(&charged, &abandoned)
	return
}

func (s *sideBySide) articlesDeliverable(ctx context.Context) (int, error) {
	var n int
	err := s.arts.QueryRowContext(ctx, `SELECT count(*) FROM outbox_messages WHERE processed_at_utc IS NULL AND attempts < ?`, articlesMaxTries).Scan(&n)
	return n, err
}

func (r *runner) baseline(ctx context.Context) error {
	sz := r.sz
	b, err := newMochi()
	if err != nil {
		return err
	}
	defer b.close()

	// Steady: the latency workload (section 3's rate) into both.
	s, err := r.newSideBySide(ctx, b, "baseline-steady")
	if err != nil {
		return err
	}
	steadyN := int(sz.baseSteady.Seconds() * float64(sz.latRate))
	from := time.Now()
	r.progress("  steady: %d orders at %d/s into both outboxes", steadyN, sz.latRate)
	if err := pace(ctx, steadyN, sz.latRate, func(i int) error { return s.order(ctx, i) }); err != nil {
		s.close()
		return err
	}
	to := time.Now()
	// Observe for as long again plus two polls, then take stock.
	observe := max(sz.baseSteady, time.Second) + 2*articlesPoll
	time.Sleep(observe)
	od, _, odel := s.oursT.latencies(from, to)
	ad, _, adel := s.artsT.latencies(from, to)
	artRate := float64(adel) / time.Since(from).Seconds()
	if err := s.close(); err != nil {
		return err
	}
	r.rep.set("baseline_steady_rate_per_s", sz.latRate)
	r.rep.set("baseline_steady_committed", steadyN)
	for _, x := range []struct {
		key string
		d   dist
		n   int
	}{{"ours", od, odel}, {"articles", ad, adel}} {
		p := "baseline_" + x.key + "_steady_"
		r.rep.set(p+"delivered", x.n)
		r.rep.set(p+"p50_ms", x.d.P50)
		r.rep.set(p+"p99_ms", x.d.P99)
		r.rep.set(p+"max_ms", x.d.Max)
	}
	r.rep.set("baseline_articles_drain_msgs_per_s", artRate)
	r.progress("  steady: ours delivered %d (%s), articles' %d (%s), its ceiling %.0f msg/s", odel, od, adel, ad, artRate)

	// Outage: a slower rate that the articles' loop can keep up with; the
	// broker goes away for baseOutage, then comes back.
	s, err = r.newSideBySide(ctx, b, "baseline-outage")
	if err != nil {
		return err
	}
	rate := sz.baseRate
	total := sz.basePre + sz.baseOutage + sz.basePost
	nOrders := int(total.Seconds() * float64(rate))
	r.progress("  outage: %d orders at %d/s; the broker is down for %s", nOrders, rate, sz.baseOutage)
	start := time.Now()
	outageErr := make(chan error, 1)
	var back time.Time
	go func() {
		time.Sleep(sz.basePre)
		b.stop()
		time.Sleep(sz.baseOutage)
		back = time.Now()
		outageErr <- b.start()
	}()
	if err := pace(ctx, nOrders, rate, func(i int) error { return s.order(ctx, i) }); err != nil {
		<-outageErr
		s.close()
		return err
	}
	if err := <-outageErr; err != nil {
		s.close()
		return fmt.Errorf("broker restart: %w", err)
	}
	// Wait until both have delivered what they still can.
	deadline := time.Now().Add(2*time.Minute + sz.baseOutage)
	for time.Now().Before(deadline) {
		st, err := s.ours.Stats(ctx)
		if err != nil {
			s.close()
			return err
		}
		left, err := s.articlesDeliverable(ctx)
		if err != nil {
			s.close()
			return err
		}
		if st.Pending == 0 && left == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the last deliveries reach the subscriber
	charged, abandoned, err := s.articlesAttempts(ctx)
	if err != nil {
		s.close()
		return err
	}
	var oursCharged, oursDead int
	if err := s.ours.DB().QueryRowContext(ctx, `SELECT coalesce(sum(attempts), 0), count(*) FILTER (WHERE dead_at IS NOT NULL) FROM outbox`).Scan(&oursCharged, &oursDead); err != nil {
		s.close()
		return err
	}
	oursPending, err := s.ours.Stats(ctx)
	if err != nil {
		s.close()
		return err
	}
	if err := s.close(); err != nil {
		return err
	}
	r.rep.set("baseline_outage_seconds", sz.baseOutage.Seconds())
	r.rep.set("baseline_outage_rate_per_s", rate)
	for _, x := range []struct {
		key       string
		a         *arrivals
		charged   int
		abandoned int
	}{{"ours", s.oursT, oursCharged, oursDead + int(oursPending.Pending)}, {"articles", s.artsT, charged, abandoned}} {
		committed, delivered, dups, disorder, last := x.a.counts()
		d, _, _ := x.a.latencies(start, time.Now())
		p := "baseline_" + x.key + "_outage_"
		r.rep.set(p+"committed", committed)
		r.rep.set(p+"delivered", delivered)
		r.rep.set(p+"abandoned", committed-delivered)
		r.rep.set(p+"attempts_charged", x.charged)
		r.rep.set(p+"duplicates", dups)
		r.rep.set(p+"out_of_order", disorder)
		r.rep.set(p+"recovery_seconds", max(0, last.Sub(back).Seconds()))
		r.rep.set(p+"p99_ms", d.P99)
		r.progress("  outage, %s: committed %d, delivered %d, never %d (stuck at the attempt cap or dead: %d), charged %d, dups %d, disorder %d, recovered %.1f s after",
			x.key, committed, delivered, committed-delivered, x.abandoned, x.charged, dups, disorder, last.Sub(back).Seconds())
	}
	scale := ""
	if r.cfg.Mode != Full {
		scale = fmt.Sprintf(" (%s; --full: 30 s)", r.cfg.Mode)
	}
	r.rep.note(7, "The articles' dispatcher (shared/seeds, the .NET one; ported in internal/bench/baseline.go): a timer every 2 s, the 50 oldest unprocessed rows with fewer than 10 attempts, "+
		"published one at a time (QoS 1, waiting for the PUBACK; no connection → connect, failure → throw), every failure counted as an attempt, one SaveChanges per batch. "+
		"Both outboxes get the same orders (one transaction each, synchronous FULL) and publish to the same in-process broker. "+
		"Steady: %s orders at %d/s, observed until %s after the last. Outage: %d orders/s (a rate the articles' loop can keep up with), the broker down for %s%s; "+
		"ours retries the broker every ≤ 2 s, like the loop (Reconnect.Max = 2 s). "+
		"A message that reaches 10 attempts is never selected again: no error is raised, it is simply not delivered.",
		thousands(int64(steadyN)), sz.latRate, observe, rate, sz.baseOutage, scale)
	return nil
}
