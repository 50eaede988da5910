package outbox

import (
	"context"
	"database/sql"
	"errors"

	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// The disk-full policy: a relay write that fails for lack of space spends
// the disk reserve, and the purge then frees space before anything else.

// writeFailed records a failed relay write. On a full disk it gives the
// disk reserve up, so that the relay can go on marking and deleting rows,
// and asks the purge loop to free space now; it reports whether it freed
// anything.
func (r *Relay) writeFailed(err error) bool {
	full, freed := r.noteWriteErr(err)
	if full {
		r.wakePurge()
	}
	return freed
}

// markFailed is writeFailed for a mark, which goes first on a full disk: the
// purge loop is woken once a mark has succeeded (see markLoop), because its
// checkpoint and vacuum would otherwise take the space the mark needs.
func (r *Relay) markFailed(err error) bool {
	_, freed := r.noteWriteErr(err)
	return freed
}

// noteWriteErr records err and, when it is a full disk, gives the reserve up.
func (r *Relay) noteWriteErr(err error) (full, freed bool) {
	r.setErr(err)
	r.metrics.writeFailed.Store(true)
	if !errors.Is(err, ErrDiskFull) {
		return false, false
	}
	r.diskFull.Store(true)
	if r.ob.reserve.Release() {
		r.log.Warn("outbox: disk full; released the disk reserve to drain and free space", "bytes", r.ob.reserve.Size)
		return true, true
	}
	return true, false
}

// walCheckpointed copies the WAL into the database file, waiting for no one,
// and reports whether all of it is there: then the next write transaction
// starts the WAL from its beginning again and needs no new space.
func walCheckpointed(ctx context.Context, conn *sqlconn.Conn) bool {
	var busy, frames, copied int
	err := conn.Do(func(c *sql.Conn) error {
		return c.QueryRowContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &frames, &copied)
	})
	return err == nil && busy == 0 && copied == frames
}
