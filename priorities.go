package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// PriorityStats is what waits at one priority (Message.Priority).
type PriorityStats struct {
	Priority int
	// Pending is the number of pending messages of this priority.
	Pending int64
	// OldestPending is the creation time of the oldest of them, as the
	// Stats or Gauges field of that name says it.
	OldestPending time.Time
}

// aboveZeroSQL is a WITH clause of k(p, s): each priority p above 0 with
// the number s above which its messages are pending (the common mark or
// p's own, whichever is higher).
var aboveZeroSQL = `WITH RECURSIVE m(p) AS (SELECT 1 UNION ALL SELECT p + 1 FROM m WHERE p < ` + strconv.Itoa(MaxPriority) + `),
	k(p, s) AS (SELECT m.p, max(st.sent_seq, ` + markOfSQL("m.p", "st") + `) FROM m, outbox_state st WHERE st.id = 1)`

// pendingOfKSQL selects the pending rows o of k's priority through the
// outbox_priority index, which a query uses only when its WHERE has the
// index's own terms literally: cheap, whatever the backlog at other
// priorities. (The statements here are short, as SQLite compiles one at
// every call, and that would cost a scrape more than the reads.)
const pendingOfKSQL = `o.priority = k.p AND o.priority > 0 AND o.dead_at IS NULL AND o.seq > k.s`

// zeroPendingSQL selects the pending rows of priority 0, which has no
// index entries, by rowid from its mark.
var zeroPendingSQL = `seq > (SELECT max(st.sent_seq, ` + markOfSQL("0", "st") + `) FROM outbox_state st WHERE st.id = 1) AND priority = 0 AND dead_at IS NULL`

// statsPrioritiesSQL counts the pending rows of every priority and finds
// the oldest creation time among them: one row per priority.
var statsPrioritiesSQL = aboveZeroSQL + ` SELECT k.p, (SELECT count(*) FROM outbox o WHERE ` + pendingOfKSQL + `),
	(SELECT min(o.created_at) FROM outbox o WHERE ` + pendingOfKSQL + `) FROM k
	UNION ALL SELECT 0, count(*), min(created_at) FROM outbox WHERE ` + zeroPendingSQL

// gaugesPrioritiesSQL counts the pending rows of every priority above 0
// in the index alone, and reads the creation time of the first in line of
// each: one row per priority above 0.
var gaugesPrioritiesSQL = aboveZeroSQL + ` SELECT k.p, (SELECT count(*) FROM outbox o WHERE ` + pendingOfKSQL + `),
	(SELECT o.created_at FROM outbox o WHERE ` + pendingOfKSQL + ` ORDER BY o.seq LIMIT 1) FROM k`

// gaugesFirstOfZeroSQL reads the creation time of the first pending
// message of priority 0 in line.
var gaugesFirstOfZeroSQL = `SELECT created_at FROM outbox WHERE ` + zeroPendingSQL + ` ORDER BY seq LIMIT 1`

// readStatsPriorities reads Stats.Priorities. A file of an older schema,
// read as it is, has no priorities: everything pending there is at 0.
func readStatsPriorities(ctx context.Context, q querier, s *Stats) error {
	if s.SchemaVersion < 9 {
		if s.Pending > 0 {
			s.Priorities = []PriorityStats{{Priority: 0, Pending: s.Pending, OldestPending: s.OldestPending}}
		}
		return nil
	}
	rows, err := q.QueryContext(ctx, statsPrioritiesSQL)
	if err != nil {
		return fmt.Errorf("outbox: stats: %w", err)
	}
	defer rows.Close()
	s.Priorities = nil
	for rows.Next() {
		var ps PriorityStats
		if err := rows.Scan(&ps.Priority, &ps.Pending, nullMillis{&ps.OldestPending}); err != nil {
			return fmt.Errorf("outbox: stats: %w", err)
		}
		if ps.Pending > 0 {
			s.Priorities = append(s.Priorities, ps)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox: stats: %w", err)
	}
	sortPriorities(s.Priorities)
	return nil
}

// readGaugesPriorities reads Gauges.Priorities without a scan of the
// table: the priorities above 0 from their index; priority 0, which has
// none, as what they leave of g.Pending, its first in line by a seek from
// its mark, made only when it has any and others wait too. When that
// finds none, g.Pending without a message limit (more than the truth while
// numbers above the mark hold no row) is theirs, exact. A file of a schema
// before priorities, read as it is, has everything at 0.
func (o *Outbox) readGaugesPriorities(ctx context.Context, g *Gauges, counted bool) error {
	g.Priorities = nil
	if o.schema < 9 {
		if g.Pending > 0 {
			g.Priorities = []PriorityStats{{Priority: 0, Pending: g.Pending, OldestPending: g.OldestPending}}
		}
		return nil
	}
	byPrio, err := o.gaugeStmts.get(ctx, o.db, gaugeByPriority, gaugesPrioritiesSQL)
	if err != nil {
		return fmt.Errorf("outbox: gauges: %w", err)
	}
	zeroFirst, err := o.gaugeStmts.get(ctx, o.db, gaugeFirstOfZero, gaugesFirstOfZeroSQL)
	if err != nil {
		return fmt.Errorf("outbox: gauges: %w", err)
	}
	rows, err := byPrio.QueryContext(ctx)
	if err != nil {
		return fmt.Errorf("outbox: gauges: %w", err)
	}
	defer rows.Close()
	var above int64
	for rows.Next() {
		var ps PriorityStats
		if err := rows.Scan(&ps.Priority, &ps.Pending, nullMillis{&ps.OldestPending}); err != nil {
			return fmt.Errorf("outbox: gauges: %w", err)
		}
		if ps.Pending > 0 {
			g.Priorities = append(g.Priorities, ps)
			above += ps.Pending
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox: gauges: %w", err)
	}
	if zero := (PriorityStats{Priority: 0, Pending: g.Pending - above}); zero.Pending > 0 {
		var err error
		if above == 0 && !g.OldestPending.IsZero() {
			// Nothing above 0 waits: the first in line is priority 0's.
			zero.OldestPending = g.OldestPending
		} else {
			err = zeroFirst.QueryRowContext(ctx).Scan(nullMillis{&zero.OldestPending})
		}
		switch {
		case errors.Is(err, sql.ErrNoRows):
			// The numbers counted hold no message of priority 0.
			if !counted {
				g.Pending = above
			}
		case err != nil:
			return fmt.Errorf("outbox: gauges: %w", err)
		default:
			g.Priorities = append(g.Priorities, zero)
		}
	}
	sortPriorities(g.Priorities)
	return nil
}

// sortPriorities puts the highest priority first.
func sortPriorities(ps []PriorityStats) {
	slices.SortFunc(ps, func(a, b PriorityStats) int { return b.Priority - a.Priority })
}

// listPriority is the condition List adds for ListOptions.Priority: the
// literal terms of the outbox_priority index for a priority above 0, so
// that SQLite reads its pending rows through it.
func (o *Outbox) listPriority(p int) (string, error) {
	if p < 0 || p > MaxPriority {
		return "", fmt.Errorf("outbox: list: priority %d outside 0..%d", p, MaxPriority)
	}
	col := o.priorityColumn()
	if p == 0 {
		return ` AND ` + col + ` = 0`, nil
	}
	return ` AND ` + col + ` = ` + strconv.Itoa(p) + ` AND ` + col + ` > 0`, nil
}
