package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the tests' PostgreSQL driver; the library imports none
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// dialectDB is a consumer's database of one dialect, with a table its
// handler writes.
type dialectDB struct {
	dialect Dialect
	// open opens another *sql.DB on the same database (another process, or
	// the same one after a restart), closed when the test ends.
	open func(t *testing.T) *sql.DB
	// fresh is a new, empty database of the same dialect.
	fresh func(t *testing.T) *dialectDB
}

// q writes a query's ? placeholders as the dialect wants them.
func (d *dialectDB) q(query string) string {
	if d.dialect != DialectPostgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (d *dialectDB) record(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
	_, err := tx.ExecContext(ctx, d.q(`INSERT INTO applied (source, id, seq, data) VALUES (?, ?, ?, ?)`), ev.Source, ev.ID, ev.Sequence, ev.Data)
	return err
}

func (d *dialectDB) count(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM applied`).Scan(&n))
	return n
}

func (d *dialectDB) appliedTick(t *testing.T, db *sql.DB, id string) time.Duration {
	t.Helper()
	var ms int64
	require.NoError(t, db.QueryRow(d.q(`SELECT applied_tick FROM inbox WHERE id = ?`), id).Scan(&ms))
	return time.Duration(ms) * time.Millisecond
}

func sqliteConsumer(t *testing.T) *dialectDB {
	path := filepath.Join(t.TempDir(), "consumer.db")
	return &dialectDB{
		dialect: DialectSQLite,
		open:    func(t *testing.T) *sql.DB { return consumerDB(t, path) },
		fresh:   sqliteConsumer,
	}
}

// postgresConsumer is a new database on pg.
func postgresConsumer(pg *harness.Postgres) func(t *testing.T) *dialectDB {
	var fresh func(t *testing.T) *dialectDB
	fresh = func(t *testing.T) *dialectDB {
		dsn := pg.NewDatabase(t)
		return &dialectDB{
			dialect: DialectPostgres,
			open: func(t *testing.T) *sql.DB {
				t.Helper()
				db, err := sql.Open("pgx", dsn)
				require.NoError(t, err)
				t.Cleanup(func() { db.Close() })
				_, err = db.Exec(`CREATE TABLE IF NOT EXISTS applied (source TEXT, id TEXT, seq BIGINT, data BYTEA)`)
				require.NoError(t, err)
				return db
			},
			fresh: fresh,
		}
	}
	return fresh
}

// forDialects runs f on a SQLite consumer database and on a PostgreSQL
// one (a server of the test's own; skipped, saying why, when PostgreSQL
// is not installed).
func forDialects(t *testing.T, f func(t *testing.T, d *dialectDB)) {
	t.Run("sqlite", func(t *testing.T) { f(t, sqliteConsumer(t)) })
	t.Run("postgres", func(t *testing.T) {
		pg := harness.StartPostgres(t, harness.PostgresOptions{})
		f(t, postgresConsumer(pg)(t))
	})
}

// TestInboxConcurrentApplyOnce: two consumer processes (two *sql.DB, an
// Inbox each) with several workers each apply the same events at once, in
// different orders: each event is applied exactly once, every other
// attempt is told ErrDuplicate, and no attempt fails.
func TestInboxConcurrentApplyOnce(t *testing.T) {
	forDialects(t, func(t *testing.T, d *dialectDB) {
		const events, workersPerDB = 300, 4
		ctx := context.Background()
		dbs := []*sql.DB{d.open(t), d.open(t)}
		var inboxes []*Inbox
		for _, db := range dbs {
			in, err := NewInbox(ctx, db, InboxOptions{Logger: testLogger()})
			require.NoError(t, err)
			inboxes = append(inboxes, in)
		}
		ids := make([]string, events)
		for i := range ids {
			ids[i] = outbox.NewID()
		}
		var applied, duplicates atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, len(inboxes)*workersPerDB)
		for _, in := range inboxes {
			for w := 0; w < workersPerDB; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					order := rand.Perm(events)
					for _, i := range order {
						err := in.Apply(ctx, outbox.Event{Source: "/stores/1", ID: ids[i], Type: "t", Sequence: int64(i + 1)}, d.record)
						switch {
						case err == nil:
							applied.Add(1)
						case errors.Is(err, outbox.ErrDuplicate):
							duplicates.Add(1)
						default:
							errs <- fmt.Errorf("event %d: %w", i, err)
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		workers := int64(len(inboxes) * workersPerDB)
		require.EqualValues(t, events, applied.Load(), "applied")
		require.EqualValues(t, events*(workers-1), duplicates.Load(), "duplicates")
		var rows, distinct int
		require.NoError(t, dbs[0].QueryRow(`SELECT count(*), count(DISTINCT id) FROM applied`).Scan(&rows, &distinct))
		require.Equal(t, []int{events, events}, []int{rows, distinct}, "rows, distinct ids in the handler's table")
		st, err := inboxes[1].Stats(ctx)
		require.NoError(t, err)
		require.EqualValues(t, events, st.Applied)
	})
}

// TestInboxDialect: the dialect is detected from the driver, or given; an
// unknown one is refused.
func TestInboxDialect(t *testing.T) {
	ctx := context.Background()
	lite := sqliteConsumer(t).open(t)
	in, err := NewInbox(ctx, lite, InboxOptions{})
	require.NoError(t, err)
	require.Equal(t, DialectSQLite, in.dialect.name, "detected")
	in, err = NewInbox(ctx, lite, InboxOptions{Dialect: DialectSQLite})
	require.NoError(t, err)
	require.Equal(t, DialectSQLite, in.dialect.name, "given")
	_, err = NewInbox(ctx, lite, InboxOptions{Dialect: "mysql"})
	require.ErrorIs(t, err, outbox.ErrUnsupportedDB)
	require.ErrorContains(t, err, `"mysql"`)

	t.Run("postgres", func(t *testing.T) {
		pg := harness.StartPostgres(t, harness.PostgresOptions{})
		db := postgresConsumer(pg)(t).open(t)
		in, err := NewInbox(ctx, db, InboxOptions{})
		require.NoError(t, err)
		require.Equal(t, DialectPostgres, in.dialect.name, "detected from the pgx driver")
		in, err = NewInbox(ctx, db, InboxOptions{Dialect: DialectPostgres})
		require.NoError(t, err)
		require.Equal(t, DialectPostgres, in.dialect.name, "given")
		_, err = NewInbox(ctx, db, InboxOptions{Dialect: "Postgres"})
		require.ErrorIs(t, err, outbox.ErrUnsupportedDB, "names are exact")
	})
}

// sqlStateError is a driver error with a SQLSTATE, as pgx's *pgconn.PgError
// is.
type sqlStateError struct{ code string }

func (e *sqlStateError) Error() string    { return "ERROR: test (SQLSTATE " + e.code + ")" }
func (e *sqlStateError) SQLState() string { return e.code }

// TestInboxRetriesSerializationFailures: on PostgreSQL a transaction that
// fails with a serialization failure or a deadlock runs again; other
// errors do not, and on SQLite a SQLSTATE means nothing.
func TestInboxRetriesSerializationFailures(t *testing.T) {
	forDialects(t, func(t *testing.T, d *dialectDB) {
		ctx := context.Background()
		db := d.open(t)
		in, err := NewInbox(ctx, db, InboxOptions{Logger: testLogger()})
		require.NoError(t, err)
		failing := func(codes ...string) (Handler, *atomic.Int64) {
			var runs atomic.Int64
			return func(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
				n := runs.Add(1)
				if int(n) <= len(codes) {
					// Wrapped, as a handler would.
					return fmt.Errorf("update stock: %w", &sqlStateError{codes[n-1]})
				}
				return d.record(ctx, tx, ev)
			}, &runs
		}
		h, runs := failing("40001", "40P01")
		err = in.Apply(ctx, outbox.Event{Source: "/s", ID: "e1"}, h)
		if d.dialect == DialectPostgres {
			require.NoError(t, err)
			require.EqualValues(t, 3, runs.Load(), "ran again after 40001 and 40P01")
			require.Equal(t, 1, d.count(t, db))
		} else {
			require.Error(t, err)
			require.EqualValues(t, 1, runs.Load())
		}
		h, runs = failing("23505")
		err = in.Apply(ctx, outbox.Event{Source: "/s", ID: "e2"}, h)
		var se *sqlStateError
		require.ErrorAs(t, err, &se)
		require.EqualValues(t, 1, runs.Load(), "a unique violation is not retried")
	})
}

// TestInboxPostgresText: what PostgreSQL's text cannot hold (NUL, invalid
// UTF-8) makes an event invalid, to be quarantined, not retried for ever;
// a quarantine row keeps a readable form of such a topic and reason.
func TestInboxPostgresText(t *testing.T) {
	forDialects(t, func(t *testing.T, d *dialectDB) {
		ctx := context.Background()
		db := d.open(t)
		in, err := NewInbox(ctx, db, InboxOptions{Logger: testLogger()})
		require.NoError(t, err)
		err = in.Apply(ctx, outbox.Event{Source: "/s", ID: "e1", Type: "order\x00placed"}, d.record)
		if d.dialect == DialectPostgres {
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			require.Zero(t, d.count(t, db))
		} else {
			require.NoError(t, err, "SQLite's text holds a NUL")
		}
		require.NoError(t, in.Quarantine(ctx, "t\x00x", []byte{0, 0xff}, "bad \xff\x00 reason"))
		var topic, reason string
		var payload []byte
		require.NoError(t, db.QueryRow(`SELECT topic, reason, payload FROM inbox_quarantine`).Scan(&topic, &reason, &payload))
		require.Equal(t, []byte{0, 0xff}, payload, "the payload is kept as it came")
		if d.dialect == DialectPostgres {
			require.Equal(t, []string{"t\uFFFDx", "bad \uFFFD\uFFFD reason"}, []string{topic, reason})
		}
	})
}
