package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// execPolling runs one write on the relay's connection and waits for the
// write lock by trying again every 200 µs, for as long as the connection's
// busy timeout, instead of in SQLite's busy handler, whose sleeps grow to
// 100 ms (1, 2, 5, 10, … 100 ms). Against an application that commits every
// millisecond at synchronous=FULL — the lock held through each fsync — that
// schedule loses the lock again and again, and marks that lag keep the
// window's slots: publishing stalled for hundreds of milliseconds (outboxctl
// bench, section 3). Polling takes the lock in the first gap between two
// of the application's transactions.
func (rc *relayConn) execPolling(ctx context.Context, c *sql.Conn, q string, args ...any) error {
	st, err := rc.stmt(ctx, c, q)
	if err != nil {
		return err
	}
	// Not prepared: SQLite applies a busy_timeout pragma when it compiles
	// the statement, not when it runs it.
	if _, err := c.ExecContext(ctx, `PRAGMA busy_timeout = 0`); err != nil {
		return err
	}
	defer c.ExecContext(context.WithoutCancel(ctx), fmt.Sprintf(`PRAGMA busy_timeout = %d`, rc.busyMS))
	deadline := time.Now().Add(time.Duration(rc.busyMS) * time.Millisecond)
	for {
		_, err := st.ExecContext(ctx, args...)
		if err == nil || !isBusy(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Microsecond)
	}
}
