package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrLeaseLost: another relay took over this relay's lease, which happens
// only when this one failed to renew it for a whole lease period.
var ErrLeaseLost = errors.New("outbox: relay lease lost to another relay")

const leaseName = "relay"

// lease makes sure that only one relay drains a database at a time, across
// goroutines and processes.
//
// Expiry is judged without comparing wall clocks, which jump on devices: the
// holder bumps a token on every renewal, and a contender takes over only
// after it has watched the token stand still for a whole TTL on its own
// monotonic clock. The holder stops dispatching when it has not renewed for
// half a TTL, so the two never overlap.
type lease struct {
	conn  *relayConn
	owner string
	ttl   time.Duration
	now   func() time.Time // wall clock, only for the displayed expiry

	mu        sync.Mutex
	lastRenew time.Time // monotonic reading of the last successful renewal
}

func (l *lease) valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lastRenew.IsZero() && time.Since(l.lastRenew) < l.ttl/2
}

func (l *lease) renewed(at time.Time) {
	l.mu.Lock()
	l.lastRenew = at
	l.mu.Unlock()
}

func (l *lease) expiresMillis() int64 { return l.now().Add(l.ttl).UnixMilli() }

// acquire blocks until the lease is held or ctx ends. waiting is called once
// with the holder's name when the lease is held by another relay.
func (l *lease) acquire(ctx context.Context, waiting func(holder string)) error {
	var w watch
	told := false
	for {
		start := time.Now()
		took, holder, err := l.try(ctx, &w, start)
		// A database held busy past the busy timeout is no reason to give
		// up: try again.
		if err != nil && !isBusy(err) {
			return err
		}
		if took {
			l.renewed(start)
			return nil
		}
		if holder != "" && !told && waiting != nil {
			waiting(holder)
			told = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(l.ttl / 8):
		}
	}
}

// watch is what a contender has seen of the holder's lease.
type watch struct {
	owner string
	token int64
	since time.Time // monotonic
}

// try takes the lease if it is free, released, ours, or unrenewed for a
// whole TTL; otherwise it returns the holder.
func (l *lease) try(ctx context.Context, w *watch, now time.Time) (took bool, holder string, err error) {
	owner, token, found, err := l.read(ctx)
	if err != nil {
		return false, "", err
	}
	switch {
	case !found:
		took, err = l.exec(ctx, `INSERT INTO outbox_lease (name, owner, token, expires_at) VALUES (?, ?, 1, ?) ON CONFLICT (name) DO NOTHING`,
			leaseName, l.owner, l.expiresMillis())
		return took, "", err
	case owner == "" || owner == l.owner:
	case owner != w.owner || token != w.token:
		*w = watch{owner: owner, token: token, since: now}
		return false, owner, nil
	case now.Sub(w.since) < l.ttl:
		return false, owner, nil
	}
	// Free, ours, or the holder has not renewed for a whole TTL: it is gone.
	took, err = l.exec(ctx, `UPDATE outbox_lease SET owner = ?, token = token + 1, expires_at = ? WHERE name = ? AND owner = ? AND token = ?`,
		l.owner, l.expiresMillis(), leaseName, owner, token)
	return took, owner, err
}

// renew extends the lease; it returns ErrLeaseLost if another relay holds it.
func (l *lease) renew(ctx context.Context) error {
	start := time.Now()
	ok, err := l.exec(ctx, `UPDATE outbox_lease SET token = token + 1, expires_at = ? WHERE name = ? AND owner = ?`,
		l.expiresMillis(), leaseName, l.owner)
	if err != nil {
		return err
	}
	if !ok {
		return ErrLeaseLost
	}
	l.renewed(start)
	return nil
}

// release hands the lease back so that a successor need not wait a TTL.
func (l *lease) release(ctx context.Context) error {
	_, err := l.exec(ctx, `UPDATE outbox_lease SET owner = '', token = token + 1, expires_at = 0 WHERE name = ? AND owner = ?`, leaseName, l.owner)
	l.renewed(time.Time{})
	return err
}

func (l *lease) read(ctx context.Context) (owner string, token int64, found bool, err error) {
	err = l.conn.do(func(c *sql.Conn) error {
		return c.QueryRowContext(ctx, `SELECT owner, token FROM outbox_lease WHERE name = ?`, leaseName).Scan(&owner, &token)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, false, nil
	}
	if err != nil {
		return "", 0, false, fmt.Errorf("outbox: lease: %w", err)
	}
	return owner, token, true, nil
}

func (l *lease) exec(ctx context.Context, query string, args ...any) (bool, error) {
	var n int64
	err := l.conn.do(func(c *sql.Conn) error {
		res, err := c.ExecContext(ctx, query, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("outbox: lease: %w", err)
	}
	return n == 1, nil
}
