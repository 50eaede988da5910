// Package txn runs a function in a database transaction and runs it again
// when the database says a new attempt may succeed (SQLite busy, a
// PostgreSQL serialization failure).
package txn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// attempts is how many times Run tries.
const attempts = 8

// Run runs fn in a transaction and commits it. When retry says a failure
// may be cured by a new attempt, it rolls back and runs fn again, a few
// times, after a short random pause: fn must not have effects outside tx.
// classify, if not nil, is applied to the errors of BEGIN and COMMIT (the
// writes the caller does not see), so that a full disk reads as the
// caller's sentinel.
func Run(ctx context.Context, db Beginner, retry func(error) bool, classify func(error) error, fn func(tx *sql.Tx) error) error {
	if classify == nil {
		classify = func(err error) error { return err }
	}
	var err error
	for i := 0; i < attempts; i++ {
		if i > 0 {
			pause := time.Duration(1+rand.IntN(10*i)) * time.Millisecond
			select {
			case <-ctx.Done():
				return errors.Join(err, ctx.Err())
			case <-time.After(pause):
			}
		}
		err = once(ctx, db, classify, fn)
		if err == nil || !retry(err) {
			return err
		}
	}
	return fmt.Errorf("outbox: database stayed busy after %d attempts: %w", attempts, err)
}

func once(ctx context.Context, db Beginner, classify func(error) error, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return classify(err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		tx.Rollback()
		return classify(err)
	}
	return nil
}

// Beginner begins a transaction: a *sql.DB, or a *sql.Conn (a
// transaction on one connection, with that connection's settings).
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Execer runs a statement: a *sql.DB, a *sql.Conn, a *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// BatchRows bounds each DELETE of InBatches' callers, so that no purge
// holds the write lock for long: writers wait at most one batch.
const BatchRows = 1000

// InBatches runs a bounded statement (a DELETE … LIMIT) until it changes
// nothing, and returns how many rows it changed in all.
func InBatches(ctx context.Context, db Execer, query string, args ...any) (int64, error) {
	var total int64
	for {
		res, err := db.ExecContext(ctx, query, args...)
		if err != nil {
			return total, fmt.Errorf("outbox: purge: %w", err)
		}
		n, _ := res.RowsAffected()
		total += n
		if n == 0 || ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}
