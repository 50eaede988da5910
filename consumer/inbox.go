package consumer

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/clock"
	"github.com/edgeoutbox/outbox/internal/migrate"
	"github.com/edgeoutbox/outbox/internal/sqlconn"
	"github.com/edgeoutbox/outbox/internal/txn"
	"github.com/edgeoutbox/outbox/internal/wait"
)

// InboxSchemaVersion is the newest inbox schema version this code knows.
const InboxSchemaVersion = 2

// DefaultDedupeWindow is how long an Inbox remembers an applied event unless
// InboxOptions says otherwise.
const DefaultDedupeWindow = 7 * 24 * time.Hour

// inboxMigrations[i] brings the inbox schema from version i to i+1.
var inboxMigrations = migrate.Steps(schemaFiles, "schema/sqlite")

// The inbox's schema, one file per migration, never edited once released:
// schema/sqlite on SQLite, schema/postgres on PostgreSQL (dialect.go).
//
//go:embed schema/sqlite/*.sql schema/postgres/*.sql
var schemaFiles embed.FS

// writeErr says ErrDiskFull for a write that failed for lack of space,
// keeping SQLite's error in the chain.
func writeErr(err error) error {
	if sqlconn.IsFull(err) {
		return fmt.Errorf("%w: %w", outbox.ErrDiskFull, err)
	}
	return err
}

// inboxClockPersistEvery is how far an Inbox's clock may run ahead of the
// stored one before an Apply stores it: a consumer that restarts (or
// crashes) more often than it purges must still see inbox time advance.
// Not at every Apply: that would add a page to every transaction's WAL
// write.
const inboxClockPersistEvery = time.Minute

// InboxOptions configures an Inbox. The zero value is ready to use.
type InboxOptions struct {
	// DedupeWindow is how long an applied event's id is remembered. A
	// duplicate that arrives later than this is not recognised. Default 7
	// days: far longer than any broker keeps a message for an offline
	// consumer in practice. It is measured on the inbox clock: the time an
	// Inbox on this database was running, which a wall-clock jump cannot
	// shorten (downtime does not count).
	DedupeWindow time.Duration
	// Dialect is the SQL dialect of the database: DialectSQLite or
	// DialectPostgres; empty (the default) detects it from db's driver
	// (PostgreSQL for github.com/jackc/pgx/v5/stdlib, SQLite otherwise).
	// Give it for another PostgreSQL driver, or a driver wrapped by
	// another package.
	Dialect Dialect
	Logger  *slog.Logger
	// Now is the wall clock; only the times shown (applied_at,
	// received_at) depend on it.
	Now func() time.Time

	// elapsed, set by tests, replaces the monotonic time since NewInbox so
	// that inbox time moves only when the test says so.
	elapsed func() time.Duration
}

// Inbox makes at-least-once delivery safe for a consumer: it runs the
// consumer's handler and records the event's (source, id) in ONE transaction
// of the consumer's own database, SQLite or PostgreSQL, so an event is
// applied once however often it is delivered. On PostgreSQL, consumers in
// several processes may share the database and apply at once.
type Inbox struct {
	db      *sql.DB
	dialect *inboxDialect
	window  time.Duration
	log     *slog.Logger
	now     func() time.Time
	clock   *clock.Stored // the inbox clock, what the window is measured on
}

// NewInbox creates or migrates the inbox schema in db and returns an Inbox.
// For PostgreSQL, open db with the github.com/jackc/pgx/v5/stdlib driver
// (sql.Open("pgx", dsn)); the library does not import it, so a device's
// binary does not carry it.
func NewInbox(ctx context.Context, db *sql.DB, opts InboxOptions) (*Inbox, error) {
	if db == nil {
		return nil, errors.New("outbox: inbox: nil *sql.DB")
	}
	if opts.DedupeWindow < 0 {
		return nil, fmt.Errorf("outbox: inbox: negative DedupeWindow")
	}
	dialect, err := dialectFor(db, opts.Dialect)
	if err != nil {
		return nil, err
	}
	if err := dialect.migrate(ctx, db); err != nil {
		return nil, fmt.Errorf("outbox: inbox schema: %w", err)
	}
	var stored int64
	if err := db.QueryRowContext(ctx, `SELECT coalesce((SELECT elapsed_ms FROM inbox_clock WHERE id = 1), 0)`).Scan(&stored); err != nil {
		return nil, fmt.Errorf("outbox: inbox clock: %w", err)
	}
	in := &Inbox{db: db, dialect: dialect, window: opts.DedupeWindow, log: opts.Logger, now: opts.Now,
		clock: clock.New(stored, opts.elapsed, inboxClockPersistEvery)}
	if in.window == 0 {
		in.window = DefaultDedupeWindow
	}
	if in.log == nil {
		in.log = slog.Default()
	}
	if in.now == nil {
		in.now = time.Now
	}
	return in, nil
}

// tickSQL stamps a row with this Inbox's tick or, when another process
// stored a later one since, with that: a row must not look older to the
// process that purges than it is.
const tickSQL = `max(?, coalesce((SELECT elapsed_ms FROM inbox_clock WHERE id = 1), 0))`

// Handler applies one event's effects inside tx. It must not have effects
// outside tx: it may run more than once when it fails or the database is
// busy, and it runs at most once successfully per (source, id).
type Handler func(ctx context.Context, tx *sql.Tx, ev outbox.Event) error

// Apply runs h for ev and records ev as applied, in one transaction. If ev
// was applied before (within the dedupe window), h does not run and Apply
// returns ErrDuplicate. If h fails, everything rolls back and its error is
// returned, so that the event can be retried; a handler that knows the event
// can never be applied returns an error wrapping ErrInvalidMessage, and the
// Subscriber quarantines it instead. An event without an id (raw
// envelope) cannot be deduplicated: h runs in a transaction, unrecorded.
func (in *Inbox) Apply(ctx context.Context, ev outbox.Event, h Handler) error {
	var persisted int64 // the tick the committed transaction stored, if any
	if ev.Source == "" && ev.ID != "" {
		return fmt.Errorf("%w: event has an id but no source", outbox.ErrInvalidMessage)
	}
	if len(ev.ID) > outbox.MaxIDBytes || !utf8.ValidString(ev.ID) || !utf8.ValidString(ev.Source) {
		return fmt.Errorf("%w: id or source is not valid UTF-8 or too long", outbox.ErrInvalidMessage)
	}
	err := txn.Run(ctx, in.db, in.dialect.retry, writeErr, func(tx *sql.Tx) error {
		persisted = 0
		if ev.ID != "" {
			// The insert comes first: it takes the write lock at once and
			// tells a duplicate before the handler runs.
			tick, persist := in.clock.Due()
			res, err := tx.ExecContext(ctx, in.dialect.insertApplied, ev.Source, ev.ID, ev.Type, ev.Sequence, in.now().UnixMilli(), tick)
			if err != nil {
				return in.dialect.insertErr(err)
			}
			if n, _ := res.RowsAffected(); n == 0 {
				return outbox.ErrDuplicate
			}
			if persist {
				if _, err := tx.ExecContext(ctx, in.dialect.bumpClock, tick); err != nil {
					return err
				}
				persisted = tick
			}
		}
		return h(ctx, tx, ev)
	})
	if err == nil && persisted > 0 {
		in.clock.CatchUp(persisted)
	}
	return err
}

// Quarantine stores a message that cannot be applied (not an event, or
// missing id, source or type) with the reason, so that it is kept for
// inspection instead of blocking the consumer.
func (in *Inbox) Quarantine(ctx context.Context, topic string, payload []byte, reason string) error {
	if payload == nil {
		payload = []byte{}
	}
	_, err := in.db.ExecContext(ctx, in.dialect.quarantine,
		in.dialect.text(topic), payload, in.dialect.text(reason), in.now().UnixMilli(), in.clock.Now())
	if err != nil {
		return fmt.Errorf("outbox: quarantine: %w", writeErr(err))
	}
	return nil
}

// applyRetrying applies ev through the Inbox with h, trying a failing
// handler again after each failure (reported to failed with the delay
// before the next try) with backoff bo, and calling beforeRetry, if set,
// before each try again: Applied or Duplicate, or Quarantined with the
// reason when retrying cannot help; ok is false when ctx ended first.
func (in *Inbox) applyRetrying(ctx context.Context, bo outbox.Backoff, ev outbox.Event, h Handler,
	failed func(err error, retryIn time.Duration), beforeRetry func()) (outcome Outcome, cause error, ok bool) {
	retry := wait.Backoff(bo).Sequence()
	for {
		err := in.Apply(ctx, ev, h)
		switch {
		case err == nil:
			return Applied, nil, true
		case errors.Is(err, outbox.ErrDuplicate):
			return Duplicate, nil, true
		case errors.Is(err, outbox.ErrInvalidMessage):
			// The event is unusable (or the handler said so by wrapping
			// ErrInvalidMessage): retrying cannot help.
			return Quarantined, err, true
		}
		if ctx.Err() != nil {
			return 0, nil, false
		}
		delay := retry.NextBackOff()
		failed(err, delay)
		if !wait.Sleep(ctx, delay, nil) {
			return 0, nil, false
		}
		if beforeRetry != nil {
			beforeRetry()
		}
	}
}

// countApplied counts an outcome of applyRetrying in a consumer's
// counters.
func countApplied(outcome Outcome, ok bool, applied, duplicates *atomic.Int64) {
	switch {
	case ok && outcome == Applied:
		applied.Add(1)
	case ok && outcome == Duplicate:
		duplicates.Add(1)
	}
}

// quarantineRetrying stores payload in the quarantine, trying again after
// each failure (reported to failed) with backoff bo until it is stored;
// false means ctx ended first. A subscriber must not acknowledge a message
// it could not keep.
func (in *Inbox) quarantineRetrying(ctx context.Context, bo outbox.Backoff, topic string, payload []byte, cause error, failed func(error)) bool {
	retry := wait.Backoff(bo).Sequence()
	for {
		err := in.Quarantine(ctx, topic, payload, cause.Error())
		if err == nil {
			return true
		}
		failed(err)
		if !wait.Sleep(ctx, retry.NextBackOff(), nil) {
			return false
		}
	}
}

// PurgeExpired forgets applied events, and deletes quarantined messages,
// older than the dedupe window on the inbox clock, in bounded batches; it
// returns how many applied events it forgot. It also stores the inbox
// clock, so that inbox time survives a restart.
func (in *Inbox) PurgeExpired(ctx context.Context) (int64, error) {
	var stored int64
	err := in.db.QueryRowContext(ctx, in.dialect.storeClock, in.clock.Now()).Scan(&stored)
	if err != nil {
		return 0, fmt.Errorf("outbox: inbox clock: %w", writeErr(err))
	}
	in.clock.CatchUp(stored)
	before := stored - in.window.Milliseconds()
	n, err := txn.InBatches(ctx, in.db, in.dialect.purgeApplied, before, txn.BatchRows)
	if err != nil {
		return n, err
	}
	_, err = txn.InBatches(ctx, in.db, in.dialect.purgeQuarantine, before, txn.BatchRows)
	return n, err
}

// purgeLoop purges now and then (a 24th of the dedupe window, between a
// second and an hour) until ctx ends: a consumer's companion to its
// connection.
func (in *Inbox) purgeLoop(ctx context.Context, log *slog.Logger) {
	wait.Every(ctx, min(max(in.window/24, time.Second), time.Hour), nil, func() {
		if _, err := in.PurgeExpired(ctx); err != nil && ctx.Err() == nil {
			log.Warn("outbox inbox purge failed", "err", err)
		}
	})
}

// InboxStats counts what an Inbox holds.
type InboxStats struct {
	Applied     int64 // events remembered (within the dedupe window)
	Quarantined int64
}

// Stats counts the inbox's rows.
func (in *Inbox) Stats(ctx context.Context) (InboxStats, error) {
	var s InboxStats
	err := in.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM inbox), (SELECT count(*) FROM inbox_quarantine)`).Scan(&s.Applied, &s.Quarantined)
	if err != nil {
		return s, fmt.Errorf("outbox: inbox stats: %w", err)
	}
	return s, nil
}
