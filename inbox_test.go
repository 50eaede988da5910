package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// consumerDB is a consumer's own database with a table its handler writes.
func consumerDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := OpenDB(path, DBOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	_, err = db.Exec(`CREATE TABLE IF NOT EXISTS applied (source TEXT, id TEXT, seq INTEGER, data BLOB)`)
	require.NoError(t, err)
	return db
}

func recordApplied(ctx context.Context, tx *sql.Tx, ev Event) error {
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
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "consumer.db")
	db := consumerDB(t, path)
	in, err := NewInbox(ctx, db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	ev := Event{Source: "/stores/1", ID: NewID(), Type: "order.created", Sequence: 7, Data: []byte(`{}`)}
	require.NoError(t, in.Apply(ctx, ev, recordApplied))
	require.ErrorIs(t, in.Apply(ctx, ev, recordApplied), ErrDuplicate)
	// The same id from another source is another event.
	other := ev
	other.Source = "/stores/2"
	require.NoError(t, in.Apply(ctx, other, recordApplied))
	require.Equal(t, 2, appliedCount(t, db))

	// Across a restart.
	db.Close()
	db = consumerDB(t, path)
	in, err = NewInbox(ctx, db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	require.ErrorIs(t, in.Apply(ctx, ev, recordApplied), ErrDuplicate)
	require.Equal(t, 2, appliedCount(t, db))
}

func TestInboxHandlerErrorRollsBack(t *testing.T) {
	ctx := context.Background()
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(ctx, db, InboxOptions{})
	require.NoError(t, err)
	ev := Event{Source: "/s", ID: "e1", Type: "t"}
	boom := errors.New("stock service down")
	err = in.Apply(ctx, ev, func(ctx context.Context, tx *sql.Tx, ev Event) error {
		if err := recordApplied(ctx, tx, ev); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Zero(t, appliedCount(t, db), "the handler's writes rolled back")
	require.NoError(t, in.Apply(ctx, ev, recordApplied), "not recorded as applied, so it is retried")
	require.Equal(t, 1, appliedCount(t, db))
}

func TestInboxValidationAndSchema(t *testing.T) {
	ctx := context.Background()
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(ctx, db, InboxOptions{})
	require.NoError(t, err)
	require.ErrorIs(t, in.Apply(ctx, Event{ID: "x"}, recordApplied), ErrInvalidMessage)
	require.ErrorIs(t, in.Apply(ctx, Event{Source: "s", ID: "\xff"}, recordApplied), ErrInvalidMessage)
	// Without an id (raw envelope) the handler runs every time.
	require.NoError(t, in.Apply(ctx, Event{Source: "raw"}, recordApplied))
	require.NoError(t, in.Apply(ctx, Event{Source: "raw"}, recordApplied))
	require.Equal(t, 2, appliedCount(t, db))

	_, err = NewInbox(ctx, db, InboxOptions{})
	require.NoError(t, err, "migrations are idempotent")
	_, err = db.Exec(`INSERT INTO inbox_schema (version) VALUES (99)`)
	require.NoError(t, err)
	_, err = NewInbox(ctx, db, InboxOptions{})
	require.ErrorIs(t, err, ErrSchemaTooNew)
}

func TestInboxDedupeWindow(t *testing.T) {
	ctx := context.Background()
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	clock := &jumpyClock{}
	in, err := NewInbox(ctx, db, InboxOptions{DedupeWindow: time.Hour, Now: clock.now})
	require.NoError(t, err)
	for i := 0; i < 2500; i++ { // more than one purge batch
		require.NoError(t, in.Apply(ctx, Event{Source: "/s", ID: fmt.Sprint(i)}, recordApplied))
	}
	require.NoError(t, in.Quarantine(ctx, "t", []byte("junk"), "not an event"))
	clock.jump(30 * time.Minute)
	n, err := in.PurgeExpired(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "still within the window")
	clock.jump(31 * time.Minute)
	n, err = in.PurgeExpired(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2500, n)
	st, err := in.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Quarantined, "quarantined messages are kept for the window too, not for ever")
	// Past the window a duplicate is no longer caught (documented).
	require.NoError(t, in.Apply(ctx, Event{Source: "/s", ID: "0"}, recordApplied))
}

// consumerSetup is a producer outbox with a relay, a broker, and a consumer
// database with an inbox.
type consumerSetup struct {
	b    *broker
	ob   *Outbox
	db   *sql.DB
	in   *Inbox
	stop func()
}

func newConsumerSetup(t *testing.T) *consumerSetup {
	b := startBroker(t)
	ob := openTest(t, Options{})
	stop := startRelay(t, mqttRelay(t, ob, b.url(), fastRelay()))
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	return &consumerSetup{b: b, ob: ob, db: db, in: in, stop: stop}
}

func (c *consumerSetup) subscriber(t *testing.T, h Handler, mod func(*SubscriberOptions)) (*Subscriber, func()) {
	opts := SubscriberOptions{
		Broker: c.b.url(), ClientID: "consumer-1", Topics: []string{"pos/#"},
		Reconnect: Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		Retry:     Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond},
		KeepAlive: 2 * time.Second, PingTimeout: time.Second, Logger: testLogger(),
	}
	if mod != nil {
		mod(&opts)
	}
	s, err := NewSubscriber(c.in, h, opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	eventually(t, 5*time.Second, "subscriber connected", func() bool { return s.Stats().Connected })
	return s, stop
}

func TestSubscriberAppliesEachEventOnce(t *testing.T) {
	c := newConsumerSetup(t)
	var failFor atomic.Int32
	failFor.Store(2) // the handler fails twice on event 10, then succeeds
	h := func(ctx context.Context, tx *sql.Tx, ev Event) error {
		if ev.Sequence == 10 && failFor.Add(-1) >= 0 {
			return errors.New("downstream not ready")
		}
		return recordApplied(ctx, tx, ev)
	}
	var mu sync.Mutex
	outcomes := map[Outcome]int{}
	s, _ := c.subscriber(t, h, func(o *SubscriberOptions) {
		o.OnEvent = func(ev Event, outcome Outcome, err error) {
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
	eventually(t, 5*time.Second, "recorder saw them", func() bool { return c.b.rec.count() >= 4 })
	all := c.b.rec.all()
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

func TestSubscriberCrashBetweenCommitAndAck(t *testing.T) {
	c := newConsumerSetup(t)
	crashed := make(chan struct{})
	var once sync.Once
	_, stop := c.subscriber(t, recordApplied, func(o *SubscriberOptions) {
		o.beforeAck = func(ev Event) bool {
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
	s, _ := c.subscriber(t, recordApplied, nil)
	eventually(t, 10*time.Second, "all applied", func() bool { return appliedCount(t, c.db) == 10 })
	eventually(t, 5*time.Second, "the unacknowledged one came again and was skipped", func() bool { return s.Stats().Duplicates == 1 })
	var distinct int
	require.NoError(t, c.db.QueryRow(`SELECT count(DISTINCT id) FROM applied`).Scan(&distinct))
	require.Equal(t, 10, distinct, "each applied once")
}
