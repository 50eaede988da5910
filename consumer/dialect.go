package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/migrate"
	"github.com/edgeoutbox/outbox/internal/sqlconn"
	"github.com/edgeoutbox/outbox/internal/txn"
)

// Dialect is the SQL dialect of an Inbox's database.
type Dialect string

const (
	// DialectSQLite is SQLite (through modernc.org/sqlite, as OpenDB opens
	// it, or another database/sql driver for SQLite).
	DialectSQLite Dialect = "sqlite"
	// DialectPostgres is PostgreSQL through the github.com/jackc/pgx/v5
	// stdlib driver (its $1 placeholders and the SQLSTATE of its errors).
	// The library does not import the driver: the program that opens the
	// *sql.DB does.
	DialectPostgres Dialect = "postgres"
)

// inboxDialect is everything an Inbox says differently on each database.
type inboxDialect struct {
	name Dialect
	// insertApplied records an event: source, id, type, sequence,
	// applied_at, tick; no row when it was applied before.
	insertApplied string
	// bumpClock stores a tick, never moving the clock back.
	bumpClock string
	// quarantine: topic, payload, reason, received_at, tick.
	quarantine string
	// storeClock stores a tick (creating the row if need be) and returns
	// the clock, which is never moved back.
	storeClock string
	// purgeApplied and purgeQuarantine delete one batch: older than a
	// tick, at most a count.
	purgeApplied, purgeQuarantine string
	migrate                       func(ctx context.Context, db *sql.DB) error
	// retry says whether a failed transaction may succeed if run again.
	retry func(error) bool
	// insertErr is what Apply returns when insertApplied fails.
	insertErr func(error) error
	// text makes a string storable in a text column.
	text func(string) string
}

// inboxPostgresMigrations[i] brings the inbox schema on PostgreSQL from
// version i to i+1: the same versions, and tables, as inboxMigrations.
var inboxPostgresMigrations = migrate.Steps(schemaFiles, "schema/postgres")

var sqliteInbox = &inboxDialect{
	name: DialectSQLite,
	insertApplied: `INSERT INTO inbox (source, id, type, sequence, applied_at, applied_tick) VALUES (?, ?, ?, ?, ?, ` + tickSQL + `)
		ON CONFLICT (source, id) DO NOTHING`,
	bumpClock:  `UPDATE inbox_clock SET elapsed_ms = max(elapsed_ms, ?) WHERE id = 1`,
	quarantine: `INSERT INTO inbox_quarantine (topic, payload, reason, received_at, received_tick) VALUES (?, ?, ?, ?, ` + tickSQL + `)`,
	// max(): several processes may share the database, and one whose
	// clock lags must not move the stored clock back; it catches up
	// instead.
	storeClock: `INSERT INTO inbox_clock (id, elapsed_ms) VALUES (1, ?)
		ON CONFLICT (id) DO UPDATE SET elapsed_ms = max(elapsed_ms, excluded.elapsed_ms)
		RETURNING elapsed_ms`,
	purgeApplied:    `DELETE FROM inbox WHERE (source, id) IN (SELECT source, id FROM inbox WHERE applied_tick < ? LIMIT ?)`,
	purgeQuarantine: `DELETE FROM inbox_quarantine WHERE seq IN (SELECT seq FROM inbox_quarantine WHERE received_tick < ? LIMIT ?)`,
	migrate: func(ctx context.Context, db *sql.DB) error {
		return migrate.SQLite(ctx, db, "inbox_schema", inboxMigrations, "", outbox.ErrSchemaTooNew)
	},
	retry:     sqlconn.IsBusy,
	insertErr: func(err error) error { return err },
	text:      func(s string) string { return s },
}

// pgTickSQL is tickSQL in PostgreSQL, its tick the parameter $n.
func pgTickSQL(n int) string {
	return fmt.Sprintf(`GREATEST($%d::bigint, coalesce((SELECT elapsed_ms FROM inbox_clock WHERE id = 1), 0))`, n)
}

// postgresInbox is the Inbox on PostgreSQL at READ COMMITTED (the
// default; a stricter default isolation only adds retried serialization
// failures). Consumers in several processes apply at once: an insert of
// an (source, id) that another transaction inserted and has not committed
// waits for it, then inserts nothing if it committed, which is what
// applying once needs.
var postgresInbox = &inboxDialect{
	name: DialectPostgres,
	insertApplied: `INSERT INTO inbox (source, id, type, sequence, applied_at, applied_tick) VALUES ($1, $2, $3, $4, $5, ` + pgTickSQL(6) + `)
		ON CONFLICT (source, id) DO NOTHING`,
	bumpClock:  `UPDATE inbox_clock SET elapsed_ms = GREATEST(elapsed_ms, $1) WHERE id = 1`,
	quarantine: `INSERT INTO inbox_quarantine (topic, payload, reason, received_at, received_tick) VALUES ($1, $2, $3, $4, ` + pgTickSQL(5) + `)`,
	storeClock: `INSERT INTO inbox_clock (id, elapsed_ms) VALUES (1, $1)
		ON CONFLICT (id) DO UPDATE SET elapsed_ms = GREATEST(inbox_clock.elapsed_ms, excluded.elapsed_ms)
		RETURNING elapsed_ms`,
	// SKIP LOCKED: consumers purging at once take different rows instead
	// of waiting on (or deadlocking with) each other.
	purgeApplied:    `DELETE FROM inbox WHERE (source, id) IN (SELECT source, id FROM inbox WHERE applied_tick < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)`,
	purgeQuarantine: `DELETE FROM inbox_quarantine WHERE seq IN (SELECT seq FROM inbox_quarantine WHERE received_tick < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)`,
	migrate: func(ctx context.Context, db *sql.DB) error {
		return migratePostgres(ctx, db, "inbox_schema", inboxPostgresMigrations)
	},
	retry: pgRetry,
	insertErr: func(err error) error {
		// Class 22, data exception: text PostgreSQL cannot store (a NUL,
		// invalid UTF-8 in the type) or a number out of range. The event
		// can never be recorded; retrying it would block the consumer.
		if strings.HasPrefix(sqlState(err), "22") {
			return fmt.Errorf("%w: %w", outbox.ErrInvalidMessage, err)
		}
		return err
	},
	// PostgreSQL's text holds neither NUL nor invalid UTF-8; what a
	// quarantine row says of a message is for people to read.
	text: func(s string) string {
		return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	},
}

// pgRetry says whether a PostgreSQL transaction failed with 40001
// (serialization_failure) or 40P01 (deadlock_detected): it was rolled back
// and may succeed if run again.
func pgRetry(err error) bool {
	c := sqlState(err)
	return c == "40001" || c == "40P01"
}

// sqlState is the SQLSTATE of a PostgreSQL error in err's chain (pgx's
// *pgconn.PgError has the method, as have other drivers' errors), or "".
// Through an interface, so that the library imports no driver.
func sqlState(err error) string {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}

// dialectFor returns the dialect given or, for "", the one of db's driver:
// PostgreSQL for pgx's stdlib driver, SQLite otherwise.
func dialectFor(db *sql.DB, d Dialect) (*inboxDialect, error) {
	switch d {
	case DialectSQLite:
		return sqliteInbox, nil
	case DialectPostgres:
		return postgresInbox, nil
	case "":
		t := reflect.TypeOf(db.Driver())
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if strings.HasPrefix(t.PkgPath(), "github.com/jackc/pgx/") {
			return postgresInbox, nil
		}
		return sqliteInbox, nil
	}
	return nil, fmt.Errorf("%w: inbox dialect %q (want %q, %q, or empty to detect it from the driver)", outbox.ErrUnsupportedDB, string(d), DialectSQLite, DialectPostgres)
}

// migratePostgres is migrateSet on PostgreSQL: the missing steps and
// their versions in one transaction (PostgreSQL's DDL is transactional,
// so a crash leaves the old schema or the new one), under an advisory
// lock, so that consumers starting at once migrate one after another
// instead of failing on each other's CREATE TABLE.
func migratePostgres(ctx context.Context, db *sql.DB, table string, steps []string) error {
	return txn.Run(ctx, db, pgRetry, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "outbox:"+table); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
			version    INTEGER NOT NULL,
			applied_at BIGINT  NOT NULL DEFAULT (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint))`); err != nil {
			return err
		}
		var version int
		if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM `+table).Scan(&version); err != nil {
			return err
		}
		if version > len(steps) {
			return fmt.Errorf("%w: %s says schema version %d, this code knows up to %d", outbox.ErrSchemaTooNew, table, version, len(steps))
		}
		for v := version; v < len(steps); v++ {
			// No arguments: pgx sends it by the simple protocol, which
			// runs a file of several statements.
			if _, err := tx.ExecContext(ctx, steps[v]); err != nil {
				return fmt.Errorf("%s migration %d: %w", table, v+1, err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (version) VALUES ($1)`, v+1); err != nil {
				return err
			}
		}
		return nil
	})
}
