// Package sqlconn is the relay's own connection to its SQLite database:
// shared by the relay's goroutines one call at a time, its statements
// prepared once, and its writes waiting for the write lock by polling
// rather than in SQLite's busy handler.
package sqlconn

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Conn is one connection taken from a pool for the relay's use. Its
// synchronous setting is NORMAL: a write of the relay's lost to power
// failure only means a duplicate, never a loss.
type Conn struct {
	mu     sync.Mutex
	conn   *sql.Conn
	busyMS int // the connection's busy timeout: how long a write polls
	// stmts are the statements the relay runs again and again, prepared
	// once on this connection: parsing SQL cost more than running a mark.
	stmts map[string]*sql.Stmt
}

// Open takes a connection from db and sets it up for the relay's writes.
func Open(ctx context.Context, db *sql.DB) (*Conn, error) {
	c, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	// The relay changes this connection's settings (synchronous, busy
	// timeout): it must not go back to the pool for the application.
	if _, err := c.ExecContext(ctx, `PRAGMA synchronous = NORMAL`); err != nil {
		discard(c)
		return nil, err
	}
	// A caller's database may come without a busy timeout; the relay's
	// writes must wait for the application's transactions, not fail.
	var busy int
	if err := c.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&busy); err != nil {
		discard(c)
		return nil, err
	}
	if busy == 0 {
		busy = 5000
		if _, err := c.ExecContext(ctx, `PRAGMA busy_timeout = 5000`); err != nil {
			discard(c)
			return nil, err
		}
	}
	return &Conn{conn: c, busyMS: busy}, nil
}

// Reader wraps a second connection of the same pool, for reads, with the
// busy timeout of w.
func Reader(c *sql.Conn, w *Conn) *Conn { return &Conn{conn: c, busyMS: w.busyMS} }

// Do runs fn with the connection, alone.
func (c *Conn) Do(fn func(*sql.Conn) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fn(c.conn)
}

// TryDo runs fn with the connection if no one else has it, and reports
// whether it did.
func (c *Conn) TryDo(fn func(*sql.Conn) error) (bool, error) {
	if !c.mu.TryLock() {
		return false, nil
	}
	defer c.mu.Unlock()
	return true, fn(c.conn)
}

// Stmt returns q prepared on sc, the connection Do gave; call it inside Do.
func (c *Conn) Stmt(ctx context.Context, sc *sql.Conn, q string) (*sql.Stmt, error) {
	if st, ok := c.stmts[q]; ok {
		return st, nil
	}
	st, err := sc.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	if c.stmts == nil {
		c.stmts = make(map[string]*sql.Stmt)
	}
	c.stmts[q] = st
	return st, nil
}

// ExecContext runs one statement, polling for the write lock, so that the
// relay's purges, batch by batch, let its marks in between. The statement
// is prepared once: an idle relay purges every minute, and parsing the
// statement cost more than running it.
func (c *Conn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := c.Do(func(sc *sql.Conn) error {
		var err error
		res, err = c.ExecPollingResult(ctx, sc, query, args...)
		return err
	})
	return res, err
}

// ExecPolling runs one write and waits for the write lock by trying again
// every 200 µs, for as long as the connection's busy timeout, instead of in
// SQLite's busy handler, whose sleeps grow to 100 ms: against an
// application that commits every millisecond at synchronous=FULL (the lock
// held through each fsync) that schedule loses the lock again and again,
// and marks that lag hold back publishing. Polling takes the lock in the
// first gap between two of the application's transactions. Call it inside
// Do.
func (c *Conn) ExecPolling(ctx context.Context, sc *sql.Conn, q string, args ...any) error {
	_, err := c.ExecPollingCount(ctx, sc, q, args...)
	return err
}

// ExecPollingCount is ExecPolling that reports how many rows the write
// changed.
func (c *Conn) ExecPollingCount(ctx context.Context, sc *sql.Conn, q string, args ...any) (int64, error) {
	res, err := c.ExecPollingResult(ctx, sc, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// ExecPollingResult is ExecPolling that returns the write's result.
func (c *Conn) ExecPollingResult(ctx context.Context, sc *sql.Conn, q string, args ...any) (sql.Result, error) {
	st, err := c.Stmt(ctx, sc, q)
	if err != nil {
		return nil, err
	}
	var res sql.Result
	err = c.poll(ctx, sc, func() error {
		var err error
		res, err = st.ExecContext(ctx, args...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// QueryRowPolling is ExecPolling for a write that returns a row
// (RETURNING), scanned into dest.
func (c *Conn) QueryRowPolling(ctx context.Context, sc *sql.Conn, q string, args []any, dest ...any) error {
	st, err := c.Stmt(ctx, sc, q)
	if err != nil {
		return err
	}
	return c.poll(ctx, sc, func() error { return st.QueryRowContext(ctx, args...).Scan(dest...) })
}

// poll runs try on sc with the busy timeout off, again every 200 µs while
// it fails busy, for as long as the connection's busy timeout.
func (c *Conn) poll(ctx context.Context, sc *sql.Conn, try func() error) error {
	// Not prepared: SQLite applies a busy_timeout pragma when it compiles
	// the statement, not when it runs it.
	if _, err := sc.ExecContext(ctx, `PRAGMA busy_timeout = 0`); err != nil {
		return err
	}
	defer sc.ExecContext(context.WithoutCancel(ctx), fmt.Sprintf(`PRAGMA busy_timeout = %d`, c.busyMS))
	deadline := time.Now().Add(time.Duration(c.busyMS) * time.Millisecond)
	for {
		err := try()
		if err == nil || !IsBusy(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// Close closes the prepared statements and discards the connection.
func (c *Conn) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.stmts {
		st.Close()
	}
	c.stmts = nil
	discard(c.conn)
}

// discard closes a connection that the relay configured for itself,
// instead of handing it back to the pool.
func discard(c *sql.Conn) {
	c.Raw(func(any) error { return driver.ErrBadConn })
	c.Close()
}

// Prepared runs queries as statements prepared once on c (sc is the
// connection Do gave): a querier for code that takes one. Use it inside Do.
type Prepared struct {
	C  *Conn
	SC *sql.Conn
}

// QueryRowContext runs q, prepared once.
func (p Prepared) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	st, err := p.C.Stmt(ctx, p.SC, q)
	if err != nil {
		return p.SC.QueryRowContext(ctx, q, args...) // says the same error
	}
	return st.QueryRowContext(ctx, args...)
}

// QueryContext runs q, prepared once.
func (p Prepared) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	st, err := p.C.Stmt(ctx, p.SC, q)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// Code returns the primary SQLite result code of err, or 0.
func Code(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() & 0xff
	}
	return 0
}

// IsFull reports whether err says that the disk is full (SQLITE_FULL).
func IsFull(err error) bool { return Code(err) == sqlite3.SQLITE_FULL }

// IsBusy reports whether err says that the database was busy or locked.
func IsBusy(err error) bool {
	c := Code(err)
	return c == sqlite3.SQLITE_BUSY || c == sqlite3.SQLITE_LOCKED
}
