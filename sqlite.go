package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// SchemaVersion is the newest schema version this code knows. A database
// whose schema is newer is refused with ErrSchemaTooNew, never downgraded.
const SchemaVersion = 2

// Synchronous selects SQLite's synchronous setting for a database opened by
// Open or OpenDB.
type Synchronous int

const (
	// SyncFull (the default) fsyncs the WAL on every commit: a commit that
	// returned survives power loss.
	SyncFull Synchronous = iota
	// SyncNormal fsyncs only at checkpoints. Commits stay atomic and the
	// file cannot be corrupted, but the last transactions before a power
	// loss may roll back — business rows and their events together, so
	// nothing phantom is published. Choose it only when losing the last
	// moments of work on power loss is acceptable.
	SyncNormal
)

func (s Synchronous) pragma() string {
	if s == SyncNormal {
		return "NORMAL"
	}
	return "FULL"
}

// DBOptions configures OpenDB.
type DBOptions struct {
	// Synchronous is SyncFull unless set.
	Synchronous Synchronous
	// BusyTimeout is how long a connection waits for another writer's lock
	// before SQLITE_BUSY. Zero means 5 s.
	BusyTimeout time.Duration
	// JournalSizeLimit caps the WAL file kept after a checkpoint, in bytes.
	// Zero means 4 MiB; negative means no limit.
	JournalSizeLimit int64
	// MustExist makes OpenDB fail, creating nothing, when the file does
	// not exist or has no outbox schema (ErrNoSchema). Inspection tools use
	// it so that a mistyped path never leaves an empty database behind.
	MustExist bool
}

// OpenDB opens (creating it if needed, readable by its owner only) the SQLite
// file at path with the settings the outbox relies on: WAL, a busy timeout,
// synchronous=FULL unless asked otherwise, incremental auto-vacuum for a new
// file, and BEGIN IMMEDIATE for every transaction so that a writer takes the
// write lock up front rather than failing on upgrade.
//
// Use the returned *sql.DB for the application's own tables too: the outbox
// row must be written in the same transaction as the business rows.
func OpenDB(path string, opts DBOptions) (*sql.DB, error) {
	if path == "" || strings.HasPrefix(path, "file:") || path == ":memory:" {
		return nil, fmt.Errorf("outbox: open: %q is not a file path (pass a plain path; an outbox needs a file for WAL)", path)
	}
	if opts.MustExist {
		if err := probeExisting(path); err != nil {
			return nil, fmt.Errorf("outbox: open %s: %w", path, err)
		}
	}
	created, err := createPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("outbox: open %s: %w", path, err)
	}
	if created {
		// auto_vacuum only takes on a new file, before WAL mode or a table
		// materialises page 1. It is set once, on a connection of its own:
		// on an existing file the pragma wants the write lock, so it must
		// not run for every pooled connection.
		if err := initNewFile(path, opts); err != nil {
			return nil, fmt.Errorf("outbox: open %s: %w", path, err)
		}
	}
	db, err := sql.Open("sqlite", dsn(path, opts, false))
	if err != nil {
		return nil, fmt.Errorf("outbox: open %s: %w", path, err)
	}
	// A quick round trip surfaces "not a database" and permission errors
	// here rather than at the first enqueue.
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		db.Close()
		return nil, fmt.Errorf("outbox: open %s: %w", path, err)
	}
	if !strings.EqualFold(mode, "wal") {
		db.Close()
		return nil, fmt.Errorf("outbox: open %s: journal_mode is %q, not WAL: %w", path, mode, ErrUnsupportedDB)
	}
	return db, nil
}

// dsn builds a file: URI. With the file: prefix the driver hands the whole URI
// to SQLite, so the path is percent-escaped; the _pragma values are fixed
// strings built here from numbers and enums, never from caller text, because
// the driver runs them verbatim.
func dsn(path string, opts DBOptions, autoVacuum bool) string {
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = 5 * time.Second
	}
	limit := opts.JournalSizeLimit
	if limit == 0 {
		limit = 4 << 20
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()))
	if autoVacuum {
		q.Add("_auto_vacuum", "INCREMENTAL")
	}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+opts.Synchronous.pragma()+")")
	q.Add("_pragma", fmt.Sprintf("journal_size_limit(%d)", limit))
	q.Add("_txlock", "immediate")
	u := url.URL{Path: path}
	return "file:" + u.EscapedPath() + "?" + q.Encode()
}

// createPrivate creates path with mode 0600 if it does not exist, and says
// whether it did. SQLite gives the -wal and -shm files the mode of the
// database file, so all three stay private.
func createPrivate(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, f.Close()
}

// probeExisting checks, read-only and without changing anything (not even
// the journal mode), that path is a SQLite file with an outbox schema.
func probeExisting(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("is a directory")
	}
	u := url.URL{Path: path}
	db, err := sql.Open("sqlite", "file:"+u.EscapedPath()+"?mode=ro")
	if err != nil {
		return err
	}
	defer db.Close()
	var n int
	err = db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN ('outbox', 'outbox_schema')`).Scan(&n)
	switch {
	case sqliteCode(err) == sqlite3.SQLITE_NOTADB:
		return fmt.Errorf("not a SQLite database")
	case err != nil:
		return err
	case n < 2:
		return ErrNoSchema
	}
	return nil
}

func initNewFile(path string, opts DBOptions) error {
	db, err := sql.Open("sqlite", dsn(path, opts, true))
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Ping()
}

// nowMillisSQL is the creation time in Unix milliseconds, written with
// julianday so that writers on old SQLite libraries (no unixepoch) can use
// the table contract too.
const nowMillisSQL = `CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)`

// uuidv7SQL builds a version 7 UUID in plain SQL, so rows inserted by other
// languages get a stable, time-sortable id without any help.
const uuidv7SQL = `lower(printf('%08x-%04x-7%03x-%04x-%012x', ` +
	nowMillisSQL + ` / 65536, ` + nowMillisSQL + ` % 65536, ` +
	`random() & 4095, 32768 | (random() & 16383), random() & 281474976710655))`

// migrations[i] brings the schema from version i to i+1. They are applied in
// one IMMEDIATE transaction, so a crash leaves either the old or the new
// schema.
var migrations = []string{
	// 1: the outbox table, its counters and the relay lease.
	`
CREATE TABLE IF NOT EXISTS outbox (
	seq          INTEGER PRIMARY KEY AUTOINCREMENT,
	id           TEXT    NOT NULL UNIQUE DEFAULT (` + uuidv7SQL + `),
	topic        TEXT    NOT NULL CHECK (length(topic) > 0 AND instr(topic, '+') = 0 AND instr(topic, '#') = 0 AND instr(topic, char(0)) = 0),
	payload      BLOB    NOT NULL,
	type         TEXT    NOT NULL DEFAULT '',
	content_type TEXT    NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL DEFAULT (` + nowMillisSQL + `),
	state        TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
	attempts     INTEGER NOT NULL DEFAULT 0,
	last_error   TEXT,
	sent_at      INTEGER,
	dead_at      INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (seq) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS outbox_dead ON outbox (seq) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS outbox_sent ON outbox (sent_at) WHERE state = 'sent';

CREATE TABLE IF NOT EXISTS outbox_counters (
	id                INTEGER PRIMARY KEY CHECK (id = 1),
	pending_count     INTEGER NOT NULL DEFAULT 0,
	pending_bytes     INTEGER NOT NULL DEFAULT 0,
	max_pending_count INTEGER NOT NULL DEFAULT 0,
	max_pending_bytes INTEGER NOT NULL DEFAULT 0
);
INSERT OR IGNORE INTO outbox_counters (id) VALUES (1);

CREATE TRIGGER IF NOT EXISTS outbox_capacity BEFORE INSERT ON outbox
WHEN (SELECT (max_pending_count > 0 AND pending_count >= max_pending_count)
          OR (max_pending_bytes > 0 AND pending_bytes + length(CAST(NEW.payload AS BLOB)) > max_pending_bytes)
      FROM outbox_counters WHERE id = 1)
BEGIN SELECT RAISE(ABORT, 'outbox full: pending limit reached'); END;

CREATE TRIGGER IF NOT EXISTS outbox_count_insert AFTER INSERT ON outbox WHEN NEW.state = 'pending'
BEGIN UPDATE outbox_counters SET pending_count = pending_count + 1,
	pending_bytes = pending_bytes + length(CAST(NEW.payload AS BLOB)) WHERE id = 1; END;

CREATE TRIGGER IF NOT EXISTS outbox_count_leave AFTER UPDATE OF state ON outbox
WHEN OLD.state = 'pending' AND NEW.state <> 'pending'
BEGIN UPDATE outbox_counters SET pending_count = pending_count - 1,
	pending_bytes = pending_bytes - length(CAST(OLD.payload AS BLOB)) WHERE id = 1; END;

CREATE TRIGGER IF NOT EXISTS outbox_count_enter AFTER UPDATE OF state ON outbox
WHEN OLD.state <> 'pending' AND NEW.state = 'pending'
BEGIN UPDATE outbox_counters SET pending_count = pending_count + 1,
	pending_bytes = pending_bytes + length(CAST(NEW.payload AS BLOB)) WHERE id = 1; END;

CREATE TRIGGER IF NOT EXISTS outbox_count_delete AFTER DELETE ON outbox WHEN OLD.state = 'pending'
BEGIN UPDATE outbox_counters SET pending_count = pending_count - 1,
	pending_bytes = pending_bytes - length(CAST(OLD.payload AS BLOB)) WHERE id = 1; END;

CREATE TABLE IF NOT EXISTS outbox_lease (
	name       TEXT    PRIMARY KEY,
	owner      TEXT    NOT NULL DEFAULT '',
	token      INTEGER NOT NULL DEFAULT 0,
	expires_at INTEGER NOT NULL DEFAULT 0
);
`,
	// 2: a sent high-water mark instead of a state per row. Schema 1 paid,
	// in every business transaction, for an AUTOINCREMENT counter, a unique
	// index on id, a partial index of pending rows and a counters row kept
	// by a trigger (6 pages written per commit where the business row needs
	// 1), and the relay paid as much again per row to mark it sent. Now a
	// message is one row in one b-tree: the relay publishes rows in seq
	// order and records, per batch, the seq up to which everything is
	// settled (outbox_state.sent_seq). See the README's table contract.
	//
	// Sequence numbers stay unique without AUTOINCREMENT (whose counter
	// is one more page per commit): deleting the newest row records its seq
	// in outbox_state.seq_floor, and the rare row that SQLite then numbers
	// at or below the floor is moved above it (outbox_seq_floor).
	`
` + outboxStateDDL + `
-- Everything at or below the old table's settled rows (or below its
-- AUTOINCREMENT counter, when its newest rows were deleted) counts as done;
-- pending rows below that line move above it, in order.
INSERT INTO outbox_state (id, sent_seq, max_pending_count, max_pending_bytes, seq_floor)
SELECT 1, CASE WHEN q > m THEN q ELSE n END, c.max_pending_count, c.max_pending_bytes, max(q, m)
FROM outbox_counters c,
	(SELECT coalesce((SELECT max(seq) FROM outbox), 0) AS m,
	        coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0) AS q,
	        coalesce((SELECT max(seq) FROM outbox WHERE state <> 'pending'), 0) AS n)
WHERE c.id = 1;

` + outboxSentLogDDL + `INSERT INTO outbox_sent_log (seq, sent_at)
SELECT sent_seq, coalesce((SELECT max(sent_at) FROM outbox WHERE state = 'sent'), ` + nowMillisSQL + `)
FROM outbox_state WHERE sent_seq > 0;

` + outboxTableDDL("outbox_v2") + `INSERT INTO outbox_v2 (seq, id, topic, payload, type, content_type, created_at, attempts, last_error, dead_at)
SELECT seq, id, topic, payload, type, content_type, created_at, attempts, last_error,
	CASE WHEN state = 'dead' THEN coalesce(dead_at, created_at) END
FROM outbox
WHERE state <> 'pending' OR seq > (SELECT sent_seq FROM outbox_state)
ORDER BY seq;
INSERT INTO outbox_v2 (seq, id, topic, payload, type, content_type, created_at, attempts, last_error)
SELECT (SELECT max(coalesce((SELECT max(seq) FROM outbox_v2), 0), seq_floor) FROM outbox_state) + row_number() OVER (ORDER BY seq),
	id, topic, payload, type, content_type, created_at, attempts, last_error
FROM outbox
WHERE state = 'pending' AND seq < (SELECT sent_seq FROM outbox_state)
ORDER BY seq;

DROP TABLE outbox;
DROP TABLE outbox_counters;
ALTER TABLE outbox_v2 RENAME TO outbox;

UPDATE outbox_state SET pending_bytes = (SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0)
	FROM outbox WHERE seq > outbox_state.sent_seq AND dead_at IS NULL)
WHERE max_pending_bytes > 0;

` + outboxObjectsDDL,
}

// The parts of schema 2, shared by migration 2 and outboxFresh.
func outboxTableDDL(name string) string {
	return `
CREATE TABLE ` + name + ` (
	seq          INTEGER PRIMARY KEY,
	id           TEXT    NOT NULL DEFAULT (` + uuidv7SQL + `),
	topic        TEXT    NOT NULL CHECK (length(topic) > 0 AND instr(topic, '+') = 0 AND instr(topic, '#') = 0 AND instr(topic, char(0)) = 0),
	payload      BLOB    NOT NULL,
	type         TEXT    NOT NULL DEFAULT '',
	content_type TEXT    NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL DEFAULT (` + nowMillisSQL + `),
	attempts     INTEGER NOT NULL DEFAULT 0,
	last_error   TEXT,
	dead_at      INTEGER
);
`
}

const outboxStateDDL = `
CREATE TABLE outbox_state (
	id                INTEGER PRIMARY KEY CHECK (id = 1),
	sent_seq          INTEGER NOT NULL DEFAULT 0,
	sent_at           INTEGER,
	max_pending_count INTEGER NOT NULL DEFAULT 0,
	max_pending_bytes INTEGER NOT NULL DEFAULT 0,
	pending_bytes     INTEGER NOT NULL DEFAULT 0,
	seq_floor         INTEGER NOT NULL DEFAULT 0
);
`

const outboxSentLogDDL = `
CREATE TABLE outbox_sent_log (
	seq     INTEGER PRIMARY KEY,
	sent_at INTEGER NOT NULL
);
`

var outboxObjectsDDL = `
CREATE INDEX outbox_dead ON outbox (seq) WHERE dead_at IS NOT NULL;

-- A mark is one statement on outbox_state; this logs when it was made.
CREATE TRIGGER outbox_sent_logged AFTER UPDATE OF sent_seq ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at) VALUES (NEW.sent_seq, coalesce(NEW.sent_at, ` + nowMillisSQL + `)); END;

-- A UUIDv7 (NewID, or the SQL default) is unique by construction; only
-- other ids, chosen by the writer (business keys), cost an index entry.
CREATE UNIQUE INDEX outbox_chosen_id ON outbox (id)
WHERE NOT (length(id) = 36 AND substr(id, 15, 1) = '7' AND substr(id, 9, 1) = '-');

-- Without limits (the default) an insert only reads outbox_state. The
-- pending count is bounded by max(seq) - sent_seq (dead rows and gaps above
-- the mark count too, until the mark passes them): one b-tree seek, no
-- counter to write. Pending bytes are counted only while a byte limit is set.
CREATE TRIGGER outbox_capacity BEFORE INSERT ON outbox
WHEN (SELECT max_pending_count > 0 OR max_pending_bytes > 0 FROM outbox_state WHERE id = 1)
BEGIN
	SELECT RAISE(ABORT, 'outbox full: pending limit reached') FROM outbox_state
	WHERE id = 1 AND ((max_pending_count > 0 AND coalesce((SELECT max(seq) FROM outbox), 0) - sent_seq >= max_pending_count)
		OR (max_pending_bytes > 0 AND pending_bytes + length(CAST(NEW.payload AS BLOB)) > max_pending_bytes));
	UPDATE outbox_state SET pending_bytes = pending_bytes + length(CAST(NEW.payload AS BLOB))
	WHERE id = 1 AND max_pending_bytes > 0;
END;

CREATE TRIGGER outbox_bytes_dead AFTER UPDATE OF dead_at ON outbox
WHEN OLD.dead_at IS NULL AND NEW.dead_at IS NOT NULL
BEGIN UPDATE outbox_state SET pending_bytes = max(pending_bytes - length(CAST(OLD.payload AS BLOB)), 0)
	WHERE id = 1 AND max_pending_bytes > 0 AND OLD.seq > sent_seq; END;

CREATE TRIGGER outbox_newest_deleted BEFORE DELETE ON outbox
WHEN OLD.seq = (SELECT max(seq) FROM outbox)
BEGIN UPDATE outbox_state SET seq_floor = max(seq_floor, OLD.seq) WHERE id = 1; END;

CREATE TRIGGER outbox_seq_floor AFTER INSERT ON outbox
WHEN NEW.seq <= (SELECT seq_floor FROM outbox_state WHERE id = 1)
BEGIN UPDATE outbox SET seq = (SELECT seq_floor FROM outbox_state WHERE id = 1) + 1 WHERE seq = NEW.seq; END;

-- Schema 1's columns, state and sent_at derived, for readers and tools.
CREATE VIEW outbox_messages AS
SELECT o.seq, o.id, o.topic, o.payload, o.type, o.content_type, o.created_at,
	CASE WHEN o.dead_at IS NOT NULL THEN 'dead' WHEN o.seq <= st.sent_seq THEN 'sent' ELSE 'pending' END AS state,
	o.attempts, o.last_error,
	CASE WHEN o.dead_at IS NULL AND o.seq <= st.sent_seq
		THEN (SELECT l.sent_at FROM outbox_sent_log l WHERE l.seq >= o.seq ORDER BY l.seq LIMIT 1) END AS sent_at,
	o.dead_at
FROM outbox o, outbox_state st WHERE st.id = 1;
`

const outboxLeaseDDL = `
CREATE TABLE IF NOT EXISTS outbox_lease (
	name       TEXT    PRIMARY KEY,
	owner      TEXT    NOT NULL DEFAULT '',
	token      INTEGER NOT NULL DEFAULT 0,
	expires_at INTEGER NOT NULL DEFAULT 0
);
`

// outboxFresh creates the newest schema on a database that has none, in
// one step: running every migration would create schema 1's tables only to
// drop them, leaving their pages free in the file.
var outboxFresh = outboxTableDDL("outbox") + outboxStateDDL + `INSERT INTO outbox_state (id) VALUES (1);` +
	outboxSentLogDDL + outboxObjectsDDL + outboxLeaseDDL

// migrate applies the outbox's missing migrations.
func migrate(ctx context.Context, db *sql.DB) error {
	return migrateSet(ctx, db, "outbox_schema", migrations, outboxFresh)
}

// migrateSet brings a schema whose version is kept in table up to
// len(steps): steps[i] goes from version i to i+1; a database without the
// schema gets fresh instead, when given, which creates the newest at once. All run in one IMMEDIATE
// transaction, so a crash leaves the old schema or the new one, and two
// processes migrating at once do not both start from the same version.
func migrateSet(ctx context.Context, db *sql.DB, table string, steps []string, fresh string) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// auto_vacuum can only change before the first table exists; on a
	// fresh database it lets retention hand space back to the file system.
	var tables int
	if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema`).Scan(&tables); err != nil {
		return err
	}
	if tables == 0 {
		if _, err := conn.ExecContext(ctx, `PRAGMA auto_vacuum = INCREMENTAL`); err != nil {
			return err
		}
	}
	// BEGIN IMMEDIATE by hand: the caller's DSN may not ask for it.
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		return err
	}
	if err := migrateLocked(ctx, conn, table, steps, fresh); err != nil {
		conn.ExecContext(context.Background(), `ROLLBACK`)
		return err
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		conn.ExecContext(context.Background(), `ROLLBACK`)
		return err
	}
	return nil
}

func migrateLocked(ctx context.Context, conn *sql.Conn, table string, steps []string, fresh string) error {
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
		version    INTEGER NOT NULL,
		applied_at INTEGER NOT NULL DEFAULT (`+nowMillisSQL+`))`); err != nil {
		return err
	}
	var version int
	if err := conn.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM `+table).Scan(&version); err != nil {
		return err
	}
	if version > len(steps) {
		return fmt.Errorf("%w: %s says schema version %d, this code knows up to %d", ErrSchemaTooNew, table, version, len(steps))
	}
	if version == 0 && fresh != "" {
		if _, err := conn.ExecContext(ctx, fresh); err != nil {
			return fmt.Errorf("%s: creating schema %d: %w", table, len(steps), err)
		}
		_, err := conn.ExecContext(ctx, `INSERT INTO `+table+` (version) VALUES (?)`, len(steps))
		return err
	}
	for v := version; v < len(steps); v++ {
		if _, err := conn.ExecContext(ctx, steps[v]); err != nil {
			return fmt.Errorf("%s migration %d: %w", table, v+1, err)
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO `+table+` (version) VALUES (?)`, v+1); err != nil {
			return err
		}
	}
	return nil
}

// readSchemaVersion reports the schema version without changing anything;
// 0 means the database has no outbox schema.
func readSchemaVersion(ctx context.Context, db *sql.DB) (int, error) {
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'outbox_schema'`).Scan(&n); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, nil
	}
	var version int
	err := db.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM outbox_schema`).Scan(&version)
	return version, err
}

// checkDB verifies what the outbox relies on in a database handed in by the
// caller.
func checkDB(ctx context.Context, db *sql.DB) error {
	var mode string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return err
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("%w: journal_mode is %q; the outbox needs WAL so that the relay's reads never block writers (open with outbox.OpenDB, or add _pragma=journal_mode(WAL) to the DSN)", ErrUnsupportedDB, mode)
	}
	var queryOnly int
	if err := db.QueryRowContext(ctx, `PRAGMA query_only`).Scan(&queryOnly); err != nil {
		return err
	}
	if queryOnly != 0 {
		return fmt.Errorf("%w: the connection is read-only (query_only)", ErrUnsupportedDB)
	}
	if max := db.Stats().MaxOpenConnections; max > 0 && max < 2 {
		return fmt.Errorf("%w: SetMaxOpenConns(%d); the relay holds one connection of its own, so allow at least 2", ErrUnsupportedDB, max)
	}
	return nil
}

// sqliteCode returns the primary SQLite result code of err, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() & 0xff
	}
	return 0
}

func isBusy(err error) bool {
	c := sqliteCode(err)
	return c == sqlite3.SQLITE_BUSY || c == sqlite3.SQLITE_LOCKED
}

// classifyWriteErr turns SQLite failures that callers must act on into the
// package's sentinels, keeping the original error in the chain.
func classifyWriteErr(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case strings.Contains(err.Error(), "outbox full"):
		return fmt.Errorf("%w: %w", ErrFull, err)
	case sqliteCode(err) == sqlite3.SQLITE_FULL:
		return fmt.Errorf("%w: %w", ErrDiskFull, err)
	}
	return err
}
