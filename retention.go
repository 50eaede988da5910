package outbox

import (
	"context"
	"database/sql"
	"strconv"
	"time"

	"github.com/edgeoutbox/outbox/internal/sqlconn"

	"github.com/edgeoutbox/outbox/internal/wait"
)

// Retention: sent rows deleted once RelayOptions.Retention has passed, and
// the free pages given back to the file system.

// purgeLoop deletes sent rows past retention and gives free pages back.
//
// A purge that left no sent row kept, nor more free pages than one step
// gives back, is not run again until a message is marked sent or the disk
// is full: there would be nothing to do, and an idle relay would pay for
// the statements every PurgeInterval (FLEET.md: hundreds of idle relays in
// one process).
func (r *Relay) purgeLoop(ctx context.Context, conn *sqlconn.Conn) {
	sentBefore, noneKept := int64(-1), false
	wait.Every(ctx, r.opts.PurgeInterval, r.purgeNow, func() {
		// Read before the purge: r.sent grows after a mark has committed,
		// so a mark the check below missed changes it.
		sent := r.sent.Load()
		if !(noneKept && sent == sentBefore && !r.diskFull.Load()) {
			call(r.hooks.onPurge)
			free, err := r.purgeOnce(ctx, conn)
			if err != nil && ctx.Err() == nil {
				r.writeFailed(err)
				r.log.Warn("outbox purge failed", "err", err)
			}
			sentBefore, noneKept = sent, err == nil && free < reclaimStep && !sentKept(ctx, conn)
		}
		r.ob.reserve.Refill()
	})
}

// sentKeptSQL says whether any sent row is kept: one up to the common mark,
// or one sent ahead of it by its priority's mark (a range for priority 0,
// empty unless priorities mix; a seek for each other).
var sentKeptSQL = func() string {
	q := `SELECT EXISTS (SELECT 1 FROM outbox WHERE seq <= (SELECT sent_seq FROM outbox_state WHERE id = 1) AND dead_at IS NULL)
	OR EXISTS (SELECT 1 FROM outbox, outbox_state st WHERE st.id = 1 AND seq > st.sent_seq AND seq <= st.sent_seq_0 AND ` + liveOfSQL(0) + `)`
	for p := 1; p <= MaxPriority; p++ {
		q += `
	OR EXISTS (SELECT 1 FROM outbox WHERE ` + liveOfSQL(p) + ` AND seq <= (SELECT sent_seq_` + strconv.Itoa(p) + ` FROM outbox_state WHERE id = 1))`
	}
	return q
}()

// sentKept reports whether any sent row is kept (or this cannot be told).
func sentKept(ctx context.Context, conn *sqlconn.Conn) bool {
	kept := true
	err := conn.Do(func(c *sql.Conn) error {
		st, err := conn.Stmt(ctx, c, sentKeptSQL)
		if err != nil {
			return err
		}
		return st.QueryRowContext(ctx).Scan(&kept)
	})
	return err != nil || kept
}

// purgeOnce deletes sent rows past retention and gives a step of free
// pages back; free is how many pages were free before that step.
func (r *Relay) purgeOnce(ctx context.Context, conn *sqlconn.Conn) (free int64, err error) {
	now := r.ob.now()
	retention := max(r.opts.Retention, 0)
	full := r.diskFull.Swap(false)
	if full {
		// The disk is full: sent rows go now, whatever the retention.
		retention = -24 * time.Hour
	}
	before := now.Add(-retention).UnixMilli()
	// A row sent "in the future" means the clock has since jumped back; it
	// would otherwise be kept until the clock catches up, without bound.
	future := now.Add(max(retention, time.Hour)).UnixMilli()
	var cuts [MaxPriority + 1]int64
	err = conn.Do(func(c *sql.Conn) error {
		cuts, err = sentCuts(ctx, c, before, future)
		return err
	})
	var deleted int64
	if err == nil {
		deleted, err = purgeSent(ctx, conn, cuts)
	}
	if err == nil && deleted > 0 {
		r.log.Debug("outbox purged sent rows", "rows", deleted)
	}
	if err == nil && full && r.connected.Load() {
		// Still draining? Each mark deletes or frees more rows; moving
		// pages and checkpointing now would spend the space those marks
		// need, for less than it will free once the backlog is gone (the
		// last mark wakes this loop again).
		var draining bool
		err = conn.Do(func(c *sql.Conn) error {
			return c.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM outbox o, outbox_state st
				WHERE st.id = 1 AND o.seq > st.sent_seq AND `+pendingSQL("o", "st")+`)`).Scan(&draining)
		})
		if err == nil && draining {
			r.diskFull.Store(true)
			return 0, nil
		}
	}
	var freed int64
	if err == nil {
		freed, err = reclaim(ctx, conn, 64)
	}
	if !full {
		return freed, classifyWriteErr(err)
	}
	if err != nil || (deleted == 0 && freed == 0) {
		// Nothing freed yet (the marks have not caught up, or this failed
		// too): a checkpoint now would only move the WAL's pages into the
		// database file, using up the space the marks need. Next time.
		r.diskFull.Store(true)
		return freed, classifyWriteErr(err)
	}
	// Hand the WAL's space back too.
	return freed, conn.Do(func(c *sql.Conn) error {
		_, err := c.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`)
		return err
	})
}

// reclaimStep is how many pages one purge gives back at most.
const reclaimStep = 2048

// reclaim returns free pages to the file system in bounded steps when the
// database uses incremental auto-vacuum (OpenDB sets it on new files) and at
// least minFree pages are free, so the file shrinks after a backlog drains.
// It returns how many pages were free.
func reclaim(ctx context.Context, conn *sqlconn.Conn, minFree int64) (int64, error) {
	var free int64
	err := conn.Do(func(c *sql.Conn) error {
		var mode int64
		for _, p := range []struct {
			q string
			v *int64
		}{{`PRAGMA auto_vacuum`, &mode}, {`PRAGMA freelist_count`, &free}} {
			st, err := conn.Stmt(ctx, c, p.q)
			if err != nil {
				return err
			}
			if err := st.QueryRowContext(ctx).Scan(p.v); err != nil {
				return err
			}
		}
		if mode != 2 || free < minFree {
			free = 0
			return nil
		}
		// A pragma that returns no rows still has to be stepped; Exec does.
		_, err := c.ExecContext(ctx, `PRAGMA incremental_vacuum(`+strconv.Itoa(reclaimStep)+`)`)
		return err
	})
	return free, err
}

func (r *Relay) wakePurge() {
	select {
	case r.purgeNow <- struct{}{}:
	default:
	}
}
