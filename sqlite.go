package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgeoutbox/outbox/internal/sqlconn"
	"github.com/edgeoutbox/outbox/internal/txn"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Synchronous selects SQLite's synchronous setting for a database opened by
// Open or OpenDB.
type Synchronous int

const (
	// SyncFull (the default) fsyncs the WAL on every commit: a commit that
	// returned survives power loss. The relay publishes what Transact
	// committed on a database Open opened at FULL without an fsync of its
	// own.
	SyncFull Synchronous = iota
	// SyncNormal does not fsync on commit. Commits stay atomic and the file
	// cannot be corrupted, but a power cut undoes the transactions
	// committed since the WAL's last fsync — business rows and their events
	// together. The relay fsyncs the WAL after reading a batch and before
	// publishing it, so a commit whose event went out is durable: no
	// phantom event, no sequence number under two ids (TestPowerLoss).
	// While the broker is away nothing syncs but SQLite's checkpoints, so
	// an outage is when the most can be lost. Choose it only when losing
	// the last moments of work on power loss is acceptable.
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
	// What is wrong with the path is said before anything is created.
	var checkErr error
	if opts.MustExist {
		checkErr = probeExisting(path)
	} else {
		checkErr = checkPath(path, false)
	}
	if checkErr != nil {
		return nil, fmt.Errorf("outbox: open %s: %w", path, checkErr)
	}
	created, err := createPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("outbox: open %s: %w", path, withoutPath(err))
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

// checkPath says what makes path unusable as a database file, before
// anything is created, in words that leave naming path to the caller's
// error: a directory where the file should be (SQLite says "unable to open
// database file"), the directory it should be in missing (the system says
// "no such file", which is not what is missing), and, when it must exist,
// the file missing.
func checkPath(path string, mustExist bool) error {
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return &reasonError{"is a directory, not a database file: give the path of a file, e.g. " + filepath.Join(path, "outbox.db"), syscall.EISDIR}
	case err == nil:
		return nil
	case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
		return withoutPath(err)
	}
	dir := filepath.Dir(path)
	di, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &reasonError{"the directory " + dir + " does not exist: create it first", fs.ErrNotExist}
	case err == nil && !di.IsDir():
		return &reasonError{dir + " is not a directory", syscall.ENOTDIR}
	case mustExist:
		return &reasonError{"no such file", fs.ErrNotExist}
	}
	return nil
}

// reasonError is an error in words of its own that errors.Is matches with
// err, whose text it leaves out.
type reasonError struct {
	msg string
	err error // fs.ErrNotExist, syscall.EISDIR, ErrForeignTable, ...
}

func (e *reasonError) Error() string { return e.msg }
func (e *reasonError) Unwrap() error { return e.err }

// withoutPath is err without the path an *fs.PathError repeats ("open
// PATH: permission denied" becomes "open: permission denied"), for an
// error that names the path already.
func withoutPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return &reasonError{pe.Op + ": " + pe.Err.Error(), pe.Err}
	}
	return err
}

// probeExisting checks, without writing anything (see readOnlyDSN), that
// path is a SQLite file with an outbox schema.
func probeExisting(path string) error {
	if err := checkPath(path, true); err != nil {
		return err
	}
	db, err := sql.Open("sqlite", readOnlyDSN(path, 0))
	if err != nil {
		return err
	}
	defer db.Close()
	var n int
	err = db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN ('outbox', 'outbox_schema')`).Scan(&n)
	switch {
	case sqlconn.Code(err) == sqlite3.SQLITE_NOTADB:
		return fmt.Errorf("not a SQLite database")
	case err != nil:
		return err
	case n < 2:
		if err := foreignTable(context.Background(), db); err != nil {
			return err
		}
		return ErrNoSchema
	}
	return nil
}

// readOnlyDSN opens path for reading only. SQLite reads a WAL database
// through its -wal and -shm files and creates them when they are missing,
// which is a write (on a full disk, one that fails): a file without a -wal
// beside it was closed cleanly and holds everything, so it is opened
// immutable, which needs neither; otherwise the files that exist are used.
func readOnlyDSN(path string, busy time.Duration) string {
	q := url.Values{}
	q.Set("mode", "ro")
	if _, err := os.Stat(path + "-wal"); errors.Is(err, os.ErrNotExist) {
		q.Set("immutable", "1")
	}
	if busy > 0 {
		q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()))
	}
	u := url.URL{Path: path}
	return "file:" + u.EscapedPath() + "?" + q.Encode()
}

// openReadOnly opens an existing outbox file for inspection: nothing is
// created, migrated or written (see readOnlyDSN).
func openReadOnly(path string, busy time.Duration) (*sql.DB, error) {
	if path == "" || strings.HasPrefix(path, "file:") || path == ":memory:" {
		return nil, fmt.Errorf("outbox: open: %q is not a file path (pass a plain path; an outbox needs a file for WAL)", path)
	}
	if err := probeExisting(path); err != nil {
		return nil, fmt.Errorf("outbox: open %s: %w", path, err)
	}
	if busy <= 0 {
		busy = 5 * time.Second
	}
	db, err := sql.Open("sqlite", readOnlyDSN(path, busy))
	if err != nil {
		return nil, fmt.Errorf("outbox: open %s: %w", path, err)
	}
	return db, nil
}

func initNewFile(path string, opts DBOptions) error {
	db, err := sql.Open("sqlite", dsn(path, opts, true))
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Ping()
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

// classifyWriteErr turns SQLite failures that callers must act on into the
// package's sentinels, keeping the original error in the chain.
func classifyWriteErr(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case isFullTrigger(err):
		return fmt.Errorf("%w: %w", ErrFull, err)
	case isTrigger(err, reservedMessage):
		return fmt.Errorf("%w: %w", ErrTopicReserved, err)
	case isTrigger(err, controlMessage):
		return fmt.Errorf("%w: %w", ErrTopicControl, err)
	case isTrigger(err, payloadMessage):
		return fmt.Errorf("%w: %w", ErrPayloadTooLarge, err)
	case sqlconn.Code(err) == sqlite3.SQLITE_FULL:
		return fmt.Errorf("%w: %w", ErrDiskFull, err)
	}
	return err
}

// What the insert's checks (outbox_insert_checked) raise: the capacity
// limit, topics no broker takes, a payload over the stored limit.
const (
	fullMessage     = "outbox full: pending limit reached"
	reservedMessage = "outbox: invalid topic: begins with $"
	controlMessage  = "outbox: invalid topic: control character or noncharacter"
	payloadMessage  = "outbox: payload too large"
)

// isFullTrigger reports whether err is the capacity trigger's own
// RAISE(ABORT).
func isFullTrigger(err error) bool { return isTrigger(err, fullMessage) }

// isTrigger reports whether err is the schema's own RAISE(ABORT) of msg: a
// SQLite constraint error from a trigger whose message is exactly msg. An
// application's error that merely mentions it is not.
func isTrigger(err error, msg string) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) || se.Code() != sqlite3.SQLITE_CONSTRAINT_TRIGGER {
		return false
	}
	// The driver's text is "<SQLite's name for the code>: <message> (<code>)".
	return strings.HasSuffix(se.Error(), ": "+msg+" ("+strconv.Itoa(se.Code())+")")
}

// runTx runs fn in a transaction and commits it. When SQLite reports the
// database busy, it rolls back and runs fn again, a few times, after a
// short random pause.
func runTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	return txn.Run(ctx, db, sqlconn.IsBusy, classifyWriteErr, fn)
}

// noSpace reports whether err says the disk has no room: SQLITE_FULL,
// SQLITE_IOERR_SHMSIZE (SQLite could not grow the -shm file, which it writes
// a page at a time so that the mapping never hits a hole) or ENOSPC.
func noSpace(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code() == sqlite3.SQLITE_IOERR_SHMSIZE {
		return true
	}
	return sqlconn.Code(err) == sqlite3.SQLITE_FULL || errors.Is(err, syscall.ENOSPC)
}
