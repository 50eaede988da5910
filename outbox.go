package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/edgeoutbox/outbox/internal/clock"
	"github.com/edgeoutbox/outbox/internal/durable"
	"github.com/edgeoutbox/outbox/internal/reserve"
)

const (
	// DefaultReserveBytes is the disk space an Outbox keeps back unless
	// Options.ReserveBytes says otherwise.
	DefaultReserveBytes = 1 << 20
	// MaxIDBytes is the longest event id the outbox and the inbox take.
	MaxIDBytes = 128
	// DefaultMaxPayloadBytes is the payload limit a new database stores.
	DefaultMaxPayloadBytes = 256 << 10
	// MaxPayloadBytesLimit is the largest Options.MaxPayloadBytes: 190 MiB,
	// whose worst-case encoding (CloudEvents structured mode, the payload
	// in base64, ×4/3, with the longest id, type, content type, source and
	// topic) still fits MQTT's largest packet (268,435,455 bytes). It also
	// bounds what one row may bring into memory. A Publisher may allow
	// less (a SizeLimiter): a message it can never carry is parked dead,
	// and NewRelay warns when the stored limit allows such messages.
	MaxPayloadBytesLimit = 190 << 20
	maxTopicBytes        = 65_535
	maxBinaryBytes       = 65_535 // MQTT's binary data: Correlation Data
	maxTypeBytes         = 1024
)

// Options configures an Outbox. The zero value is ready to use.
type Options struct {
	// MaxPayloadBytes limits each payload. The limit is stored in the
	// database, as the pending limits are, so that every writer is held to
	// it: Enqueue refuses a longer payload with ErrPayloadTooLarge, and so
	// does the INSERT of any other writer, and the relay parks a longer one
	// already stored dead without reading it. Zero leaves the stored limit
	// as it is (a new database stores DefaultMaxPayloadBytes); at most
	// MaxPayloadBytesLimit.
	MaxPayloadBytes int
	// MaxPendingMessages and MaxPendingBytes cap what waits to be sent.
	// When either is reached, Enqueue fails with ErrFull. The limits are
	// stored in the database, so every writer — other processes and other
	// languages included — is held to them. Zero leaves the stored limit as
	// it is; a negative value removes it.
	MaxPendingMessages int64
	MaxPendingBytes    int64
	// Synchronous, BusyTimeout and MustExist are used by Open only; see
	// DBOptions.
	Synchronous Synchronous
	BusyTimeout time.Duration
	MustExist   bool
	// ReadOnly makes Open inspect an existing file without writing anything:
	// no file, schema, migration, counter or disk reserve is created or
	// changed (not even SQLite's -wal and -shm files when the database was
	// closed cleanly). Stats, List and Get work on this schema version and
	// the one before it; the calls that write fail with ErrReadOnly. Open
	// only; a file without an outbox fails with ErrNoSchema (ErrForeignTable
	// when a table of the outbox's name is someone else's), an older one
	// with ErrSchemaTooOld.
	ReadOnly bool
	// TopicPrefix, if set, is where every topic must start (end it with a
	// '/'): Enqueue refuses others with ErrTopicOutsidePrefix. A fleet's
	// broker ACL usually lets a device publish only under its own prefix,
	// and some brokers (Mosquitto) acknowledge a denied publish and drop
	// it; this catches a wrong topic while the caller's transaction can
	// still roll back. RelayOptions.TopicPrefix does the same for rows
	// written by plain SQL.
	TopicPrefix string
	// ReserveBytes is disk space kept back in a file beside the database
	// (PATH-reserve) so that, when the disk fills, the relay can still mark
	// and delete sent rows and so free space; the application's writes fail
	// with ErrDiskFull first. Zero means DefaultReserveBytes (1 MiB);
	// negative means none.
	ReserveBytes int64
	// Logger receives the outbox's and its relays' logs. Nil means
	// slog.Default(). Payloads and credentials are never logged.
	Logger *slog.Logger
	// Now is the clock. Nil means time.Now. Order never depends on it, nor
	// does expiry (Message.Expiry runs on the outbox clock, which only
	// monotonic time moves).
	Now func() time.Time

	// elapsed, set by tests, replaces the monotonic time since Open that
	// moves the outbox clock, so that it moves only when the test says so.
	elapsed func() time.Duration
}

// Outbox writes messages into the outbox table and manages what is there.
// It is safe for concurrent use.
type Outbox struct {
	db         *sql.DB
	insert     *inserts
	reserve    *reserve.Reserve // nil without a file or when disabled
	path       string           // the database file, as SQLite names it
	ownsDB     bool
	readOnly   bool // Options.ReadOnly: insert is nil
	schema     int  // the schema version: SchemaVersion, or older when readOnly
	maxPayload int
	prefix     string
	log        *slog.Logger
	now        func() time.Time
	clock      *clock.Stored // what Message.Expiry is measured on (expiry.go)
	// commandClock is the same stored clock as commands see it: never
	// paused, since a command's life runs whether or not a relay of this
	// Outbox has messages in flight (commands.go).
	commandClock *clock.Stored
	wake         notifier
	// commandWake wakes Commands.Run when StoreCommand stored a command.
	commandWake notifier
	durable     durable.Commits // what Transact committed at FULL
	gaugeStmts  gaugeStmts      // Gauges' statements (metrics.go)

	mu      sync.Mutex
	closed  bool
	relays  map[*Relay]struct{}
	relayWG sync.WaitGroup
	// hooks are set by tests: beforeTx runs in Transact between its check
	// for Close and BEGIN, afterCommit after a COMMIT that returned, before
	// anything else; commandTx in StoreCommand's transaction.
	hooks struct {
		beforeTx, afterCommit func()
		commandTx             func(*sql.Tx)
	}
	// inUse is held shared by every Enqueue while it runs and exclusively
	// by Close while it closes the insert statement and the database, so
	// that an Enqueue racing Close either writes or fails with ErrClosed.
	inUse sync.RWMutex
}

// Open opens (or creates) the SQLite file at path with OpenDB and returns an
// Outbox that owns it: Close closes the database. Use DB for the
// application's own tables.
//
// When the disk is too full to open the database — SQLite must create and
// grow the -shm file first — Open deletes the disk reserve (PATH-reserve), if
// there is one, and tries once more: a device that restarts on a full disk
// can then relay its backlog and so free space.
func Open(ctx context.Context, path string, opts Options) (*Outbox, error) {
	if opts.ReadOnly {
		// Inspection never spends the reserve: it is the relay's.
		return openInspector(ctx, path, opts)
	}
	o, err := openOnce(ctx, path, opts)
	if err == nil || !noSpace(err) {
		return o, err
	}
	size, ok := reserve.ReleaseFile(path)
	if !ok {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	log.Warn("outbox: disk full on open; released the disk reserve and trying again", "path", path, "bytes", size, "err", err)
	return openOnce(ctx, path, opts)
}

func openOnce(ctx context.Context, path string, opts Options) (*Outbox, error) {
	db, err := OpenDB(path, DBOptions{Synchronous: opts.Synchronous, BusyTimeout: opts.BusyTimeout, MustExist: opts.MustExist})
	if err != nil {
		return nil, err
	}
	o, err := New(ctx, db, opts)
	if err != nil {
		db.Close()
		return nil, err
	}
	o.ownsDB = true
	o.durable.Full = opts.Synchronous == SyncFull
	return o, nil
}

// oldestReadableSchema is the oldest schema version a read-only Outbox
// reads: Stats, List and Get use what versions 2 and 3 share.
const oldestReadableSchema = 2

// openInspector is Open with Options.ReadOnly.
func openInspector(ctx context.Context, path string, opts Options) (*Outbox, error) {
	db, err := openReadOnly(path, opts.BusyTimeout)
	if err != nil {
		return nil, err
	}
	v, err := readSchemaVersion(ctx, db)
	switch {
	case err != nil:
		err = fmt.Errorf("outbox: open %s: %w", path, err)
	case v > SchemaVersion:
		err = fmt.Errorf("outbox: open %s: %w: it says schema version %d, this code knows up to %d", path, ErrSchemaTooNew, v, SchemaVersion)
	case v < oldestReadableSchema:
		err = fmt.Errorf("outbox: open %s: %w: it has schema version %d, this code reads %d to %d", path, ErrSchemaTooOld, v, oldestReadableSchema, SchemaVersion)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	o := &Outbox{db: db, ownsDB: true, readOnly: true, schema: v, log: opts.Logger, now: opts.Now, clock: clock.New(0, opts.elapsed, outboxClockStoreEvery), commandClock: clock.New(0, opts.elapsed, outboxClockStoreEvery), relays: make(map[*Relay]struct{})}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.now == nil {
		o.now = time.Now
	}
	return o, nil
}

// New returns an Outbox on the caller's database, creating or migrating the
// schema. The database must be in WAL mode and writable; the caller keeps
// ownership of db. For best results open it with OpenDB.
func New(ctx context.Context, db *sql.DB, opts Options) (*Outbox, error) {
	if db == nil {
		return nil, fmt.Errorf("outbox: nil *sql.DB")
	}
	if opts.MaxPayloadBytes < 0 || opts.MaxPayloadBytes > MaxPayloadBytesLimit {
		return nil, fmt.Errorf("outbox: MaxPayloadBytes %d outside 0..%d", opts.MaxPayloadBytes, MaxPayloadBytesLimit)
	}
	if opts.TopicPrefix != "" {
		if err := validatePrefix(opts.TopicPrefix); err != nil {
			return nil, err
		}
	}
	if err := checkDB(ctx, db); err != nil {
		return nil, err
	}
	if err := foreignTable(ctx, db); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	if err := migrateOutbox(ctx, db); err != nil {
		return nil, fmt.Errorf("outbox: schema: %w", err)
	}
	maxPayload, err := setLimits(ctx, db, opts.MaxPendingMessages, opts.MaxPendingBytes, opts.MaxPayloadBytes)
	if err != nil {
		return nil, fmt.Errorf("outbox: limits: %w", err)
	}
	stored, err := readOutboxClock(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("outbox: clock: %w", err)
	}
	insert, err := prepareInserts(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	var file string
	if err := db.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file); err != nil {
		insert.close()
		return nil, fmt.Errorf("outbox: %w", err)
	}
	reserveSize := opts.ReserveBytes
	if reserveSize == 0 {
		reserveSize = DefaultReserveBytes
	}
	o := &Outbox{
		db:           db,
		insert:       insert,
		reserve:      reserve.New(file, reserveSize),
		path:         file,
		maxPayload:   maxPayload,
		prefix:       opts.TopicPrefix,
		schema:       SchemaVersion,
		log:          opts.Logger,
		now:          opts.Now,
		clock:        clock.New(stored, opts.elapsed, outboxClockStoreEvery),
		commandClock: clock.New(stored, opts.elapsed, outboxClockStoreEvery),
		relays:       make(map[*Relay]struct{}),
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.now == nil {
		o.now = time.Now
	}
	if err := o.reserve.Fill(); err != nil {
		o.log.Warn("outbox could not write its disk reserve", "path", file+"-reserve", "err", err)
	}
	return o, nil
}

// setLimits stores the limits that are set (not zero), counts again what
// they are checked against, and returns the stored payload limit.
func setLimits(ctx context.Context, db *sql.DB, count, bytes int64, payload int) (stored int, err error) {
	err = runTx(ctx, db, func(tx *sql.Tx) error {
		if payload != 0 {
			if _, err := tx.ExecContext(ctx, `UPDATE outbox_state SET max_payload_bytes = ? WHERE id = 1`, payload); err != nil {
				return err
			}
		}
		// Never above the cap, whatever a hand-edited row says.
		if err := tx.QueryRowContext(ctx, `SELECT min(max_payload_bytes, ?) FROM outbox_state WHERE id = 1`, MaxPayloadBytesLimit).Scan(&stored); err != nil {
			return err
		}
		if count != 0 {
			if _, err := tx.ExecContext(ctx, `UPDATE outbox_state SET max_pending_count = ? WHERE id = 1`, max(count, 0)); err != nil {
				return err
			}
		}
		if bytes != 0 {
			if _, err := tx.ExecContext(ctx, `UPDATE outbox_state SET max_pending_bytes = ? WHERE id = 1`, max(bytes, 0)); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, recountSQL)
		return err
	})
	return stored, err
}

// MaxPayloadBytes is the payload limit stored in the database, as Open (or
// New) read it, after storing Options.MaxPayloadBytes if set.
func (o *Outbox) MaxPayloadBytes() int { return o.maxPayload }

// DB returns the database the outbox writes to.
func (o *Outbox) DB() *sql.DB { return o.db }

// Close stops the relays started from this Outbox (waiting, bounded, for
// their in-flight acknowledgements), makes further Enqueue calls fail with
// ErrClosed and, if Open opened the database, closes it. Close is
// idempotent.
func (o *Outbox) Close() error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return nil
	}
	o.closed = true
	for r := range o.relays {
		r.stop()
	}
	o.mu.Unlock()
	o.relayWG.Wait()
	o.inUse.Lock()
	defer o.inUse.Unlock()
	if !o.readOnly && o.clock.Ahead() >= time.Second.Milliseconds() {
		// So that the time this outbox ran counts after a restart too; not
		// for an Outbox that lived less than a second (outboxctl's).
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := o.storeClock(ctx, o.db); err != nil {
			o.log.Warn("outbox could not store its clock on close", "err", err)
		}
		cancel()
	}
	if o.insert != nil {
		o.insert.close()
	}
	o.gaugeStmts.close()
	if o.ownsDB {
		return o.db.Close()
	}
	return nil
}

func (o *Outbox) isClosed() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.closed
}
