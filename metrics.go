package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeoutbox/outbox/internal/reserve"
)

// histBounds are the upper bounds, in seconds, of the buckets of the
// relay's histograms: from half a millisecond on loopback to a day of
// backlog after an outage.
var histBounds = [...]float64{
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400,
}

// HistogramBounds returns the upper bounds, in seconds, of the buckets of
// the relay's histograms (RelayMetrics.PublishAck and CommitAck), ascending.
func HistogramBounds() []float64 { return append([]float64(nil), histBounds[:]...) }

// Histogram is a snapshot of one of the relay's histograms.
type Histogram struct {
	// Counts[i] is how many observations were at most histBounds[i]
	// seconds (cumulative, as Prometheus wants them).
	Counts [len(histBounds)]uint64
	Count  uint64  // every observation, those above the last bound too
	Sum    float64 // seconds
}

// hist is a fixed-bucket histogram that an observation updates with a few
// atomic adds: no lock and no allocation on the acknowledgement path.
type hist struct {
	buckets [len(histBounds) + 1]atomic.Uint64 // the last one: above every bound
	sumNS   atomic.Int64
}

func (h *hist) observe(d time.Duration) {
	d = max(d, 0)
	s := d.Seconds()
	i := 0
	for i < len(histBounds) && s > histBounds[i] {
		i++
	}
	h.buckets[i].Add(1)
	h.sumNS.Add(int64(d))
}

func (h *hist) snapshot() Histogram {
	var out Histogram
	var n uint64
	for i := range histBounds {
		n += h.buckets[i].Load()
		out.Counts[i] = n
	}
	out.Count = n + h.buckets[len(histBounds)].Load()
	out.Sum = float64(h.sumNS.Load()) / 1e9
	return out
}

// relayMetrics holds what RelayMetrics reports beyond RelayStats: counters
// the relay bumps where things happen, read without the database.
type relayMetrics struct {
	attempts    atomic.Int64 // connection attempts
	charged     atomic.Int64 // attempts charged against messages
	publishAck  hist         // hand-off to PUBACK, monotonic
	commitAck   hist         // commit to PUBACK, wall clock
	leaseHeld   atomic.Bool
	writeFailed atomic.Bool // the last database write failed

	mu        sync.Mutex
	draining  bool      // drain is running: time without a connection counts
	connected bool      // as the relay last said
	since     time.Time // when connected last changed (or drain started)
	atSince   int64     // attempts at since: what came after are this outage's
	down      time.Duration
}

// setConnected records a change of the connection's state at now; drain
// calls it when it starts (false), connects, disconnects and ends.
func (m *relayMetrics) setConnected(connected, draining bool, now time.Time) {
	m.mu.Lock()
	if m.draining && !m.connected {
		m.down += now.Sub(m.since)
	}
	if m.connected != connected || m.draining != draining || m.since.IsZero() {
		m.since, m.atSince = now, m.attempts.Load()
	}
	m.connected, m.draining = connected, draining
	m.mu.Unlock()
}

// acked records a PUBACK seen at now for a message handed over at sent and
// committed at createdMS (Unix ms by the writer's clock).
func (r *Relay) acked(sent time.Time, createdMS int64) {
	r.metrics.publishAck.observe(time.Since(sent))
	r.metrics.commitAck.observe(time.Duration(r.ob.now().UnixMilli()-createdMS) * time.Millisecond)
}

// RelayMetrics is what an exporter reads from a relay (outboxprom does),
// from memory only: no database read, cheap enough for every scrape.
type RelayMetrics struct {
	Running   bool // Run is running
	Connected bool
	// Since is when Connected last changed, or when the relay started
	// trying to connect; zero before that.
	Since time.Time
	// ConnectionAttempts counts calls to Publisher.Connect, the ones that
	// succeeded too.
	ConnectionAttempts int64
	// AttemptsSince counts the calls to Publisher.Connect since Since:
	// while not connected, those of the current outage; 0 while connected.
	AttemptsSince int64
	// Disconnected is the time spent draining without a connection: the
	// current outage included, the wait for the lease not.
	Disconnected time.Duration
	Published    int64 // messages acknowledged (RelayStats.SentSince)
	DeadLettered int64 // messages parked as dead (RelayStats.DeadSince)
	// AttemptsCharged counts the failed attempts charged against messages
	// by the isolation rule (each adds one to a row's attempts).
	AttemptsCharged int64
	InFlight        int64
	// HoldsLease says whether this relay holds the relay lease now.
	HoldsLease bool
	// LastWriteOK says whether the relay's last database write (a mark, a
	// lease renewal) succeeded; true before any.
	LastWriteOK bool
	// PublishAck is the time from handing a message to the publisher to its
	// acknowledgement, by the monotonic clock.
	PublishAck Histogram
	// CommitAck is the time from a message's commit (its created_at, by the
	// writer's wall clock) to its acknowledgement (by Options.Now): it
	// includes every wait in the outbox, outages too. A clock that jumps
	// shifts it; what would be negative counts as 0.
	CommitAck   Histogram
	Protocol    string
	Source      string // RelayOptions.Source
	LastError   string
	LastErrorAt time.Time
	// LastErr is the error LastError is the text of, nil with it empty:
	// what errors.Is and errors.As see (the status page words it by its
	// kind).
	LastErr error
	// BrokerUnavailable is what the broker says of itself while it says
	// it cannot take messages (ErrBrokerUnavailable: busy, over quota,
	// shutting down…), in words, and BrokerUnavailableSince since when;
	// "" once a message is acknowledged or the relay fails otherwise.
	BrokerUnavailable      string
	BrokerUnavailableSince time.Time
	// NoSubscribers counts the messages the broker took saying that no
	// subscription matched their topic (MQTT 5's PUBACK 0x10), counted in
	// Published too: they reached nobody unless a persistent session held
	// them. NoSubscribersTopic and NoSubscribersAt are the last one's topic
	// and when (by Options.Now). See NoSubscribersToken.
	NoSubscribers      int64
	NoSubscribersTopic string
	NoSubscribersAt    time.Time
}

// Metrics returns the relay's counters without reading the database.
func (r *Relay) Metrics() RelayMetrics {
	m := &r.metrics
	out := RelayMetrics{
		ConnectionAttempts: m.attempts.Load(),
		Published:          r.sent.Load(),
		DeadLettered:       r.dead.Load(),
		AttemptsCharged:    m.charged.Load(),
		InFlight:           r.inFlight.Load(),
		HoldsLease:         m.leaseHeld.Load(),
		LastWriteOK:        !m.writeFailed.Load(),
		PublishAck:         m.publishAck.snapshot(),
		CommitAck:          m.commitAck.snapshot(),
		Source:             r.opts.Source,
	}
	now := time.Now()
	m.mu.Lock()
	out.Connected, out.Since, out.Disconnected = m.connected, m.since, m.down
	out.AttemptsSince = max(out.ConnectionAttempts-m.atSince, 0)
	if m.draining && !m.connected {
		out.Disconnected += now.Sub(m.since)
	}
	m.mu.Unlock()
	r.mu.Lock()
	out.Running, out.Protocol = r.running, r.protocol
	out.BrokerUnavailable, out.BrokerUnavailableSince = r.said.says, r.said.since
	if r.lastErr != nil {
		out.LastError, out.LastErrorAt, out.LastErr = r.lastErr.Error(), r.errAt, r.lastErr
	}
	r.mu.Unlock()
	out.NoSubscribers, out.NoSubscribersTopic, out.NoSubscribersAt = r.noSubscribers.read()
	return out
}

// Gauges are the outbox's figures that need no scan of the table: a read of
// outbox_state, two seeks and the dead rows' index (and, without a message
// limit, the rows sent ahead of the common mark, in the outbox_priority
// index), whatever the backlog (BenchmarkGauges100k), where Stats counts
// rows.
type Gauges struct {
	// Pending is the number of pending messages. With a message limit set
	// it comes from the counters the triggers keep, exact. Without, it is
	// the sequence numbers above the relay's common mark less the dead rows
	// there and the rows sent ahead of it by their priority's mark:
	// exact unless numbers above the mark hold no row — a requeue of a
	// message the relay had not passed, rows deleted by hand — and then
	// more than the truth until the relay passes them.
	Pending int64
	// PendingBytes is their payload bytes, known (PendingBytesKnown) only
	// while a byte limit is set; otherwise Stats counts them.
	PendingBytes      int64
	PendingBytesKnown bool
	// OldestPending is the creation time of the first pending message in
	// line, found by a seek; zero if none. A requeued message waits at the
	// back of the line with its own, earlier, creation time, which only
	// Stats, reading every pending row, finds.
	OldestPending time.Time
	Dead          int64
	// DatabaseBytes and WALBytes are the sizes of the database file and its
	// write-ahead log; FreeBytes is the space left to this user on their
	// file system (FreeBytesKnown: the platform tells).
	DatabaseBytes  int64
	WALBytes       int64
	FreeBytes      int64
	FreeBytesKnown bool
	// Priorities are the pending messages by priority, highest first: one
	// for each priority that has any. Those above 0 are counted in their
	// index, exact; priority 0's, which has no index, is Pending less
	// theirs, as exact as Pending. Each OldestPending is the first in
	// line's, as OldestPending above.
	Priorities []PriorityStats
	// Commands are the commands received, by state, counted in their
	// table (which holds settled ones only for CommandOptions.Keep).
	Commands CommandStats
}

// sentAheadSQL counts the rows sent ahead of the common mark by their
// priority's mark (st is outbox_state): a range of priority 0's, empty
// unless priorities mix, and index ranges of the others'.
var sentAheadSQL = func() string {
	q := `((SELECT count(*) FROM outbox WHERE seq > st.sent_seq AND seq <= st.sent_seq_0 AND ` + liveOfSQL(0) + `)`
	for p := 1; p <= MaxPriority; p++ {
		q += `
				+ (SELECT count(*) FROM outbox WHERE ` + liveOfSQL(p) + ` AND seq > st.sent_seq AND seq <= st.sent_seq_` + strconv.Itoa(p) + `)`
	}
	return q + `)`
}()

// gaugesSQL is Gauges' statement. A file of a schema before priorities,
// read as it is, has no marks of priorities.
func (o *Outbox) gaugesSQL() string {
	sentAhead, pending := sentAheadSQL, pendingSQL("o", "st")
	if o.schema < 9 {
		sentAhead, pending = `0`, `o.dead_at IS NULL`
	}
	return `SELECT
		CASE WHEN st.max_pending_count > 0
			THEN max(coalesce((SELECT max(seq) FROM outbox), 0), st.seq_floor, st.sent_seq) - st.sent_seq - st.skipped
			ELSE max(coalesce((SELECT max(seq) FROM outbox), 0), st.sent_seq) - st.sent_seq
				- (SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL AND seq > st.sent_seq)
				- ` + sentAhead + ` END,
		st.pending_bytes, st.max_pending_count, st.max_pending_bytes,
		(SELECT o.created_at FROM outbox o WHERE o.seq > st.sent_seq AND ` + pending + ` ORDER BY o.seq LIMIT 1),
		(SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL)
		FROM outbox_state st WHERE id = 1`
}

// gaugeStmts are Gauges' statements, each prepared at its first use: it
// takes several times longer to prepare one than to run it, and an
// exporter calls Gauges on every scrape.
type gaugeStmts struct {
	mu     sync.Mutex
	closed bool
	stmts  [gaugeStmtCount]*sql.Stmt
}

// Gauges' statements.
const (
	gaugeTotals      = iota // gaugesSQL
	gaugeByPriority         // gaugesPrioritiesSQL
	gaugeFirstOfZero        // gaugesFirstOfZeroSQL
	gaugeStmtCount
)

// get returns statement k, preparing q on db the first time.
func (s *gaugeStmts) get(ctx context.Context, db *sql.DB, k int, q string) (*sql.Stmt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.stmts[k] == nil {
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			return nil, err
		}
		s.stmts[k] = st
	}
	return s.stmts[k], nil
}

// close closes the statements; get fails after.
func (s *gaugeStmts) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, st := range s.stmts {
		if st != nil {
			st.Close()
		}
	}
}

// Gauges reads the figures that cost no scan of the table.
func (o *Outbox) Gauges(ctx context.Context) (Gauges, error) {
	var g Gauges
	var maxCount, maxBytes int64
	dest := []any{&g.Pending, &g.PendingBytes, &maxCount, &maxBytes, nullMillis{&g.OldestPending}, &g.Dead}
	var err error
	if st, perr := o.gaugeStmts.get(ctx, o.db, gaugeTotals, o.gaugesSQL()); perr == nil {
		err = st.QueryRowContext(ctx).Scan(dest...)
	} else {
		err = o.db.QueryRowContext(ctx, o.gaugesSQL()).Scan(dest...)
	}
	if err != nil {
		return Gauges{}, fmt.Errorf("outbox: gauges: %w", err)
	}
	g.Pending = max(g.Pending, 0)
	g.PendingBytesKnown = maxBytes > 0
	if !g.PendingBytesKnown {
		g.PendingBytes = 0
	}
	if fi, err := os.Stat(o.path); err == nil {
		g.DatabaseBytes = fi.Size()
	}
	if fi, err := os.Stat(o.path + "-wal"); err == nil {
		g.WALBytes = fi.Size()
	}
	g.FreeBytes, g.FreeBytesKnown = reserve.FreeBytes(o.path)
	if err := o.readGaugesPriorities(ctx, &g, maxCount > 0); err != nil {
		return Gauges{}, err
	}
	if err := readCommandStats(ctx, o.db, o.schema, &g.Commands); err != nil {
		return Gauges{}, err
	}
	return g, nil
}

// RelayStats is the relay's view: the outbox's counters plus its own.
type RelayStats struct {
	Stats
	Connected   bool
	InFlight    int64
	SentSince   int64 // messages acknowledged since Run started
	DeadSince   int64 // messages parked as dead since Run started
	LastError   string
	LastErrorAt time.Time
	LastAck     time.Time // last acknowledged publish
	// WALSyncs is how many fsyncs of the WAL the relay made before
	// publishing since Run started, failed ones included (durable before
	// publish: a commit made at synchronous=NORMAL must be on the disk before
	// the broker has its event). It is there to show what that guarantee
	// costs: at most one per batch read, so one per event under a trickle;
	// in a backlog a batch read ahead is made durable by the next of
	// MarkSyncs, which are counted here too.
	WALSyncs int64
	// MarkSyncs is how many of WALSyncs were made to keep the relay's own
	// marks durable, so that a power cut duplicates at most Window +
	// max(Window, 256) messages, as a crash does (internal/durable). They
	// come only while that many run ahead of the last sync: none under a
	// trickle, a few per thousand events when draining fast (BENCHMARKS.md).
	MarkSyncs int64
	// Protocol is what the publisher's connection speaks (an MQTT version,
	// "5" or "3.1.1", or another protocol's name: ProtocolNamer), as it
	// last connected; empty for a publisher that does not say.
	Protocol string
	// Broker is the address the publisher's connection is on, as it last
	// connected (MQTTOptions.Brokers: a cluster's node), without
	// credentials; empty for a publisher that does not say.
	Broker string
	// ExpiredSince counts the messages parked as expired since Run started.
	ExpiredSince int64
	// BrokerUnavailable and BrokerUnavailableSince are RelayMetrics'.
	BrokerUnavailable      string
	BrokerUnavailableSince time.Time
	// NoSubscribers, NoSubscribersTopic and NoSubscribersAt are
	// RelayMetrics'.
	NoSubscribers      int64
	NoSubscribersTopic string
	NoSubscribersAt    time.Time
}

// Stats returns the relay's counters and the outbox's.
func (r *Relay) Stats(ctx context.Context) (RelayStats, error) {
	s, err := r.ob.Stats(ctx)
	r.mu.Lock()
	rs := RelayStats{
		Stats:       s,
		Connected:   r.connected.Load(),
		InFlight:    r.inFlight.Load(),
		SentSince:   r.sent.Load(),
		DeadSince:   r.dead.Load(),
		LastErrorAt: r.errAt,
		LastAck:     r.lastAck,
		Protocol:    r.protocol,
	}
	rs.WALSyncs = r.wal.Syncs.Load()
	rs.MarkSyncs = r.markSyncs.Load()
	rs.Broker = r.broker()
	rs.ExpiredSince = r.expired.Load()
	rs.BrokerUnavailable, rs.BrokerUnavailableSince = r.said.says, r.said.since
	if r.lastErr != nil {
		rs.LastError = r.lastErr.Error()
	}
	r.mu.Unlock()
	rs.NoSubscribers, rs.NoSubscribersTopic, rs.NoSubscribersAt = r.noSubscribers.read()
	return rs, err
}
