package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/migrate"
)

// consumerDB is a consumer's own database with a table its handler writes.
func consumerDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := outbox.OpenDB(path, outbox.DBOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	_, err = db.Exec(`CREATE TABLE IF NOT EXISTS applied (source TEXT, id TEXT, seq INTEGER, data BLOB)`)
	require.NoError(t, err)
	return db
}

func recordApplied(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO applied (source, id, seq, data) VALUES (?, ?, ?, ?)`, ev.Source, ev.ID, ev.Sequence, ev.Data)
	return err
}

func appliedCount(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM applied`).Scan(&n))
	return n
}

func TestInboxAppliesOnce(t *testing.T) {
	forDialects(t, func(t *testing.T, d *dialectDB) {
		ctx := context.Background()
		db := d.open(t)
		in, err := NewInbox(ctx, db, InboxOptions{Logger: testLogger()})
		require.NoError(t, err)
		ev := outbox.Event{Source: "/stores/1", ID: outbox.NewID(), Type: "order.created", Sequence: 7, Data: []byte(`{}`)}
		require.NoError(t, in.Apply(ctx, ev, d.record))
		require.ErrorIs(t, in.Apply(ctx, ev, d.record), outbox.ErrDuplicate)
		// The same id from another source is another event.
		other := ev
		other.Source = "/stores/2"
		require.NoError(t, in.Apply(ctx, other, d.record))
		require.Equal(t, 2, d.count(t, db))

		// Across a restart.
		db.Close()
		db = d.open(t)
		in, err = NewInbox(ctx, db, InboxOptions{Logger: testLogger()})
		require.NoError(t, err)
		require.ErrorIs(t, in.Apply(ctx, ev, d.record), outbox.ErrDuplicate)
		require.Equal(t, 2, d.count(t, db))
	})
}

func TestInboxHandlerErrorRollsBack(t *testing.T) {
	forDialects(t, func(t *testing.T, d *dialectDB) {
		ctx := context.Background()
		db := d.open(t)
		in, err := NewInbox(ctx, db, InboxOptions{})
		require.NoError(t, err)
		ev := outbox.Event{Source: "/s", ID: "e1", Type: "t"}
		boom := errors.New("stock service down")
		err = in.Apply(ctx, ev, func(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
			if err := d.record(ctx, tx, ev); err != nil {
				return err
			}
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.Zero(t, d.count(t, db), "the handler's writes rolled back")
		require.NoError(t, in.Apply(ctx, ev, d.record), "not recorded as applied, so it is retried")
		require.Equal(t, 1, d.count(t, db))
	})
}

func TestInboxValidationAndSchema(t *testing.T) {
	forDialects(t, func(t *testing.T, d *dialectDB) {
		ctx := context.Background()
		db := d.open(t)
		in, err := NewInbox(ctx, db, InboxOptions{})
		require.NoError(t, err)
		require.ErrorIs(t, in.Apply(ctx, outbox.Event{ID: "x"}, d.record), outbox.ErrInvalidMessage)
		require.ErrorIs(t, in.Apply(ctx, outbox.Event{Source: "s", ID: "\xff"}, d.record), outbox.ErrInvalidMessage)
		// Without an id (raw envelope) the handler runs every time.
		require.NoError(t, in.Apply(ctx, outbox.Event{Source: "raw"}, d.record))
		require.NoError(t, in.Apply(ctx, outbox.Event{Source: "raw"}, d.record))
		require.Equal(t, 2, d.count(t, db))

		_, err = NewInbox(ctx, db, InboxOptions{})
		require.NoError(t, err, "migrations are idempotent")
		_, err = db.Exec(`INSERT INTO inbox_schema (version) VALUES (99)`)
		require.NoError(t, err)
		_, err = NewInbox(ctx, db, InboxOptions{})
		require.ErrorIs(t, err, outbox.ErrSchemaTooNew)
	})
}

func storedInboxClock(t *testing.T, db *sql.DB) time.Duration {
	t.Helper()
	var ms int64
	require.NoError(t, db.QueryRow(`SELECT elapsed_ms FROM inbox_clock WHERE id = 1`).Scan(&ms))
	return time.Duration(ms) * time.Millisecond
}

func TestInboxDedupeWindow(t *testing.T) {
	forDialects(t, func(t *testing.T, d *dialectDB) {
		ctx := context.Background()
		db := d.open(t)
		clock := &harness.JumpyClock{}
		el := &harness.FakeElapsed{}
		in, err := NewInbox(ctx, db, InboxOptions{DedupeWindow: time.Hour, Now: clock.Now, elapsed: el.Elapsed})
		require.NoError(t, err)
		for i := 0; i < 2500; i++ { // more than one purge batch
			require.NoError(t, in.Apply(ctx, outbox.Event{Source: "/s", ID: fmt.Sprint(i)}, d.record))
		}
		require.NoError(t, in.Quarantine(ctx, "t", []byte("junk"), "not an event"))
		// The wall clock says two hours passed; the inbox clock did not move.
		clock.Jump(2 * time.Hour)
		n, err := in.PurgeExpired(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "a wall-clock jump purges nothing")
		el.Advance(30 * time.Minute)
		n, err = in.PurgeExpired(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "still within the window")
		el.Advance(31 * time.Minute)
		n, err = in.PurgeExpired(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 2500, n)
		st, err := in.Stats(ctx)
		require.NoError(t, err)
		require.Zero(t, st.Quarantined, "quarantined messages are kept for the window too, not for ever")
		// Past the window a duplicate is no longer caught (documented).
		require.NoError(t, in.Apply(ctx, outbox.Event{Source: "/s", ID: "0"}, d.record))
	})
}

// TestInboxClockJumpForward: a consumer that booted with its clock near
// 1970 applies an event, then NTP sets the clock to 2026. The purge must
// not forget the event, in the same Inbox or after a restart.
func TestInboxClockJumpForward(t *testing.T) {
	forDialects(t, func(t *testing.T, d *dialectDB) {
		ctx := context.Background()
		boot := time.Date(1970, 1, 1, 0, 5, 0, 0, time.UTC)
		synced := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		ev := outbox.Event{Source: "/stores/1", ID: outbox.NewID(), Type: "order.created"}
		setup := func(t *testing.T) (*dialectDB, *sql.DB, *harness.FixedClock, *Inbox) {
			d := d.fresh(t)
			db := d.open(t)
			clock := harness.NewFixedClock(boot)
			in, err := NewInbox(ctx, db, InboxOptions{Logger: testLogger(), Now: clock.Now})
			require.NoError(t, err)
			require.NoError(t, in.Apply(ctx, ev, d.record))
			require.NoError(t, in.Quarantine(ctx, "pos/orders", []byte("junk"), "not an event"))
			clock.Set(synced)
			return d, db, clock, in
		}
		check := func(t *testing.T, d *dialectDB, db *sql.DB, in *Inbox) {
			n, err := in.PurgeExpired(ctx)
			require.NoError(t, err)
			require.Zero(t, n, "the clock jump made the purge forget an applied event")
			require.ErrorIs(t, in.Apply(ctx, ev, d.record), outbox.ErrDuplicate, "the redelivery must be recognised")
			require.Equal(t, 1, d.count(t, db))
			st, err := in.Stats(ctx)
			require.NoError(t, err)
			require.Equal(t, InboxStats{Applied: 1, Quarantined: 1}, st)
		}
		t.Run("same inbox", func(t *testing.T) {
			d, db, _, in := setup(t)
			check(t, d, db, in)
		})
		t.Run("after a restart", func(t *testing.T) {
			d, db, clock, _ := setup(t)
			require.NoError(t, db.Close())
			db = d.open(t)
			in, err := NewInbox(ctx, db, InboxOptions{Logger: testLogger(), Now: clock.Now})
			require.NoError(t, err)
			check(t, d, db, in)
		})
	})
}

// TestInboxClockPersists: inbox time carries over a restart, from the last
// purge and from an Apply that found the stored clock behind.
func TestInboxClockPersists(t *testing.T) {
	forDialects(t, func(t *testing.T, d *dialectDB) {
		ctx := context.Background()
		db := d.open(t)
		el := &harness.FakeElapsed{}
		opts := InboxOptions{DedupeWindow: time.Hour, Logger: testLogger(), elapsed: el.Elapsed}
		in, err := NewInbox(ctx, db, opts)
		require.NoError(t, err)
		require.NoError(t, in.Apply(ctx, outbox.Event{Source: "/s", ID: "old"}, d.record))
		el.Advance(40 * time.Minute)
		n, err := in.PurgeExpired(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, 40*time.Minute, storedInboxClock(t, db))
		el.Advance(5 * time.Minute)
		require.NoError(t, in.Apply(ctx, outbox.Event{Source: "/s", ID: "new"}, d.record))
		require.Equal(t, 45*time.Minute, storedInboxClock(t, db), "an Apply persists a clock that is minutes ahead")

		// The process stops (no purge); downtime does not count.
		require.NoError(t, db.Close())
		db = d.open(t)
		el = &harness.FakeElapsed{}
		opts.elapsed = el.Elapsed
		in, err = NewInbox(ctx, db, opts)
		require.NoError(t, err)
		el.Advance(14 * time.Minute)
		n, err = in.PurgeExpired(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "59 minutes of inbox time")
		el.Advance(2 * time.Minute)
		n, err = in.PurgeExpired(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "61 minutes of inbox time: the first event is forgotten, across the restart")
		require.ErrorIs(t, in.Apply(ctx, outbox.Event{Source: "/s", ID: "new"}, d.record), outbox.ErrDuplicate)
		require.NoError(t, in.Apply(ctx, outbox.Event{Source: "/s", ID: "old"}, d.record))
		require.Equal(t, 61*time.Minute, storedInboxClock(t, db))
	})
}

// TestInboxClockShared: two Inbox values on one database (two consumer
// processes) share the inbox clock; it never goes backwards, and the one
// that lags moves forward to what the other stored.
func TestInboxClockShared(t *testing.T) {
	forDialects(t, func(t *testing.T, d *dialectDB) {
		ctx := context.Background()
		db1 := d.open(t)
		db2 := d.open(t)
		el1, el2 := &harness.FakeElapsed{}, &harness.FakeElapsed{}
		in1, err := NewInbox(ctx, db1, InboxOptions{DedupeWindow: time.Hour, Logger: testLogger(), elapsed: el1.Elapsed})
		require.NoError(t, err)
		in2, err := NewInbox(ctx, db2, InboxOptions{DedupeWindow: time.Hour, Logger: testLogger(), elapsed: el2.Elapsed})
		require.NoError(t, err)
		require.NoError(t, in1.Apply(ctx, outbox.Event{Source: "/s", ID: "e1"}, d.record))

		el1.Advance(50 * time.Minute)
		n, err := in1.PurgeExpired(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		// in2 has not purged yet (its own clock says 0), but an event it
		// applies is stamped with the later stored clock.
		require.NoError(t, in2.Apply(ctx, outbox.Event{Source: "/s", ID: "e0"}, d.record))
		require.Equal(t, 50*time.Minute, d.appliedTick(t, db2, "e0"))
		el2.Advance(20 * time.Minute)
		n, err = in2.PurgeExpired(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, 50*time.Minute, storedInboxClock(t, db1), "the lagging inbox did not move the clock back")

		// in2 now counts from 50 minutes: 11 more are past the window.
		el2.Advance(11 * time.Minute)
		n, err = in2.PurgeExpired(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		require.Equal(t, 61*time.Minute, storedInboxClock(t, db1))
		// in1's own clock (50 minutes) is behind what in2 stored; its purge
		// does not move the stored clock back either.
		n, err = in1.PurgeExpired(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, 61*time.Minute, storedInboxClock(t, db1))
		// And in1's clock has moved forward to 61 and runs on from there.
		el1.Advance(3 * time.Minute)
		require.NoError(t, in1.Apply(ctx, outbox.Event{Source: "/s", ID: "e2"}, d.record))
		require.Equal(t, 64*time.Minute, d.appliedTick(t, db1, "e2"))
		require.Equal(t, 64*time.Minute, storedInboxClock(t, db1))
	})
}

// TestInboxMigrationFromSchema1: a version 1 inbox keeps its rows and does
// not purge them when it migrates, whatever their wall-clock times say.
func TestInboxMigrationFromSchema1(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "consumer.db")
	db := consumerDB(t, path)
	require.NoError(t, migrate.SQLite(ctx, db, "inbox_schema", inboxMigrations[:1], "", outbox.ErrSchemaTooNew))
	// Applied in 1970 (a device that never synced its clock) and a year ago.
	yearAgo := time.Now().AddDate(-1, 0, 0).UnixMilli()
	_, err := db.Exec(`INSERT INTO inbox (source, id, type, sequence, applied_at) VALUES
		('/s', 'e1', 't', 1, 1000), ('/s', 'e2', 't', 2, ?);
		INSERT INTO inbox_quarantine (topic, payload, reason, received_at) VALUES ('t', x'00', 'junk', 1000)`, yearAgo)
	require.NoError(t, err)

	el := &harness.FakeElapsed{}
	in, err := NewInbox(ctx, db, InboxOptions{DedupeWindow: time.Hour, Logger: testLogger(), elapsed: el.Elapsed})
	require.NoError(t, err)
	var version int
	require.NoError(t, db.QueryRow(`SELECT max(version) FROM inbox_schema`).Scan(&version))
	require.Equal(t, InboxSchemaVersion, version)
	n, err := in.PurgeExpired(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the migration must not purge old rows at once")
	require.ErrorIs(t, in.Apply(ctx, outbox.Event{Source: "/s", ID: "e1"}, recordApplied), outbox.ErrDuplicate)
	var appliedAt int64
	require.NoError(t, db.QueryRow(`SELECT applied_at FROM inbox WHERE id = 'e2'`).Scan(&appliedAt))
	require.Equal(t, yearAgo, appliedAt, "the wall-clock time shown is kept")

	// They are kept one full window of inbox time after the migration.
	el.Advance(59 * time.Minute)
	n, err = in.PurgeExpired(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	el.Advance(2 * time.Minute)
	n, err = in.PurgeExpired(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	st, err := in.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, InboxStats{}, st)
}

// consumerSetup is a producer outbox with a relay, a broker, and a consumer
// database with an inbox.
type consumerSetup struct {
	b    *broker
	ob   *outbox.Outbox
	db   *sql.DB
	in   *Inbox
	stop func()
}

func newConsumerSetup(t *testing.T) *consumerSetup {
	b := startBroker(t)
	ob := openTest(t, outbox.Options{})
	stop := startRelay(t, mqttRelay(t, ob, b.url(), fastRelay()))
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	return &consumerSetup{b: b, ob: ob, db: db, in: in, stop: stop}
}

func (c *consumerSetup) subscriber(t *testing.T, h Handler, mod func(*SubscriberOptions)) (*Subscriber, func()) {
	opts := SubscriberOptions{Broker: c.b.url(), ClientID: "consumer-1", Topics: []string{"pos/#"}}
	if mod != nil {
		mod(&opts)
	}
	s, stop := runSubscriber(t, c.in, h, opts)
	// Connected once the SUBACK is read, which a resumed session's backlog
	// comes before (TestSubscriberResumesLargeBacklog: 1,000 events, each
	// applied in a transaction of its own, seconds on a loaded machine).
	eventually(t, 30*time.Second, "subscriber connected", func() bool { return s.Stats().Connected })
	return s, stop
}

func TestSubscriberAppliesEachEventOnce(t *testing.T) {
	forProtocols(t, testSubscriberAppliesEachEventOnce)
}

func testSubscriberAppliesEachEventOnce(t *testing.T, proto outbox.MQTTProtocol) {
	c := newConsumerSetup(t)
	var failFor atomic.Int32
	failFor.Store(2) // the handler fails twice on event 10, then succeeds
	h := func(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
		if ev.Sequence == 10 && failFor.Add(-1) >= 0 {
			return errors.New("downstream not ready")
		}
		return recordApplied(ctx, tx, ev)
	}
	var mu sync.Mutex
	outcomes := map[Outcome]int{}
	s, _ := c.subscriber(t, h, func(o *SubscriberOptions) {
		o.Protocol = proto
		o.OnEvent = func(ev outbox.Event, outcome Outcome, err error) {
			mu.Lock()
			outcomes[outcome]++
			mu.Unlock()
		}
	})
	for i := 0; i < 50; i++ {
		commitOrder(t, c.ob, "pos/orders", i)
	}
	eventually(t, 10*time.Second, "50 applied", func() bool { return appliedCount(t, c.db) == 50 })

	// The broker delivers one of them again, and something that is not an
	// event at all.
	eventually(t, 5*time.Second, "recorder saw them", func() bool { return c.b.rec.Count() >= 4 })
	all := c.b.rec.All()
	require.NoError(t, c.b.srv.Publish("pos/orders", all[3].payload, false, 1))
	require.NoError(t, c.b.srv.Publish("pos/orders", []byte("not an event"), false, 1))
	require.NoError(t, c.b.srv.Publish("pos/orders", []byte(`{"specversion":"1.0","id":"x"}`), false, 1))
	commitOrder(t, c.ob, "pos/orders", 50)
	eventually(t, 10*time.Second, "51 applied", func() bool { return appliedCount(t, c.db) == 51 })
	// The row commits before the counters and OnEvent learn of it.
	eventually(t, 5*time.Second, "counted", func() bool {
		st := s.Stats()
		mu.Lock()
		defer mu.Unlock()
		return st.Applied == 51 && st.Duplicates == 1 && st.Quarantined == 2 && outcomes[Applied] == 51
	})
	st := s.Stats()
	require.EqualValues(t, 51, st.Applied)
	require.Equal(t, proto.String(), st.Protocol)
	mu.Lock()
	require.Equal(t, map[Outcome]int{Applied: 51, Duplicate: 1, Quarantined: 2}, outcomes)
	mu.Unlock()
	require.EqualValues(t, 2, st.HandlerErrors)
	is, err := c.in.Stats(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 2, is.Quarantined)
	var reason string
	require.NoError(t, c.db.QueryRow(`SELECT reason FROM inbox_quarantine ORDER BY seq LIMIT 1`).Scan(&reason))
	require.Contains(t, reason, "decode event")
	// Applied in commit order.
	rows, err := c.db.Query(`SELECT seq FROM applied ORDER BY rowid`)
	require.NoError(t, err)
	defer rows.Close()
	var last int64
	for rows.Next() {
		var seq int64
		require.NoError(t, rows.Scan(&seq))
		require.Greater(t, seq, last)
		last = seq
	}
}

// TestSubscriberCrashBetweenCommitAndAck: an event committed whose PUBACK
// never left comes again and is recognised. Over MQTT 5 the PUBACKs of the
// last ackInterval before the crash may be lost too (they go in batches):
// those events come again as well, and are recognised as well.
func TestSubscriberCrashBetweenCommitAndAck(t *testing.T) {
	forProtocols(t, testSubscriberCrashBetweenCommitAndAck)
}

func testSubscriberCrashBetweenCommitAndAck(t *testing.T, proto outbox.MQTTProtocol) {
	c := newConsumerSetup(t)
	crashed := make(chan struct{})
	var once sync.Once
	_, stop := c.subscriber(t, recordApplied, func(o *SubscriberOptions) {
		o.Protocol = proto
		o.beforeAck = func(ev outbox.Event) bool {
			if ev.Sequence != 3 {
				return true
			}
			// Committed, but the process "dies" before the PUBACK.
			once.Do(func() { close(crashed) })
			return false
		}
	})
	for i := 0; i < 3; i++ {
		commitOrder(t, c.ob, "pos/orders", i)
	}
	<-crashed
	stop()
	require.Equal(t, 3, appliedCount(t, c.db))

	// Events committed while the consumer is away wait in its session.
	for i := 3; i < 10; i++ {
		commitOrder(t, c.ob, "pos/orders", i)
	}
	eventually(t, 5*time.Second, "relay sent them", func() bool { return countState(t, c.ob, "sent") == 10 })
	var mu sync.Mutex
	var dups []int64
	s, _ := c.subscriber(t, recordApplied, func(o *SubscriberOptions) {
		o.Protocol = proto
		o.OnEvent = func(ev outbox.Event, outcome Outcome, _ error) {
			if outcome == Duplicate {
				mu.Lock()
				dups = append(dups, ev.Sequence)
				mu.Unlock()
			}
		}
	})
	eventually(t, 10*time.Second, "all applied", func() bool { return appliedCount(t, c.db) == 10 })
	eventually(t, 5*time.Second, "the unacknowledged one came again and was skipped", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(dups, 3)
	})
	if proto == outbox.Protocol311 {
		require.EqualValues(t, 1, s.Stats().Duplicates, "3.1.1 acknowledges each at once")
	}
	var distinct int
	require.NoError(t, c.db.QueryRow(`SELECT count(DISTINCT id) FROM applied`).Scan(&distinct))
	require.Equal(t, 10, distinct, "each applied once")
}
