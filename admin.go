package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/edgeoutbox/outbox/internal/txn"
)

// State is the state of a row in the outbox table.
type State string

// The states of an outbox row.
const (
	StatePending State = "pending" // waiting to be published
	StateSent    State = "sent"    // acknowledged by the broker, kept for the retention period
	StateDead    State = "dead"    // failed by itself too often; kept until requeued or purged
	// StateExpired: its Message.Expiry ran out before its turn, so it was
	// not published; kept until requeued (without its expiry) or purged,
	// as a dead message is.
	StateExpired State = "expired"
)

// Stats describes what is in the outbox.
type Stats struct {
	Pending       int64     // messages waiting to be published
	PendingBytes  int64     // their payload bytes
	OldestPending time.Time // earliest creation time among pending messages (a requeued one included, though it waits at the back of the line); zero if none
	Dead          int64     // dead messages
	Expired       int64     // messages parked as expired (not counted in Dead)
	Sent          int64     // sent messages still within retention
	// MaxPendingMessages and MaxPendingBytes are the stored limits; 0 means none.
	MaxPendingMessages int64
	MaxPendingBytes    int64
	SchemaVersion      int
	LeaseOwner         string    // relay holding the lease; empty if none
	LeaseExpires       time.Time // by the holder's clock at its last renewal; an idle holder lets it pass (RelayOptions.LeaseTTL); zero if no relay holds the lease
	// LeaseProtocol is what the lease holder's connection speaks (an MQTT
	// version, "5" or "3.1.1", or another protocol's name: ProtocolNamer),
	// as it last connected; empty if not known.
	LeaseProtocol string
	// LeaseBrokerUnavailable is what the broker says of itself, as the
	// lease holder last recorded it, while it says it cannot take
	// messages (RelayStats.BrokerUnavailable), and
	// LeaseBrokerUnavailableSince since when; empty and zero otherwise.
	LeaseBrokerUnavailable      string
	LeaseBrokerUnavailableSince time.Time
	// LeaseNoSubscribers counts the messages the broker took with no
	// subscriber since the lease holder started (RelayStats.NoSubscribers),
	// as it last recorded them (at most once a minute per topic), the
	// last topic and when.
	LeaseNoSubscribers      int64
	LeaseNoSubscribersTopic string
	LeaseNoSubscribersAt    time.Time
	// Priorities are the pending messages by priority, highest first: one
	// for each priority that has any, its OldestPending as OldestPending
	// above.
	Priorities []PriorityStats
	// Commands are the commands received (docs/commands.md), by state.
	Commands CommandStats
}

// Stats reads the outbox's state. Pending, PendingBytes and Sent count rows
// (a range of the table; no counter is written per message), so it takes
// longer as the backlog grows (BenchmarkStats100k); Gauges reads what an
// exporter needs without a scan.
func (o *Outbox) Stats(ctx context.Context) (Stats, error) {
	return readStats(ctx, o.db)
}

func readStats(ctx context.Context, q querier) (Stats, error) {
	var s Stats
	if err := q.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM outbox_schema`).Scan(&s.SchemaVersion); err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	// The pending rows are read once for their count, bytes and oldest
	// creation time: not the first in line's, since a requeued message
	// joins the back of the line with its own. Sent rows are those up to
	// the common mark and those sent ahead of it by their priority's mark;
	// a file of a schema before priorities, read as it is, has no such
	// marks.
	pending, sentAhead := `o.dead_at IS NULL`, `0`
	if s.SchemaVersion >= 9 {
		pending, sentAhead = pendingSQL("o", "st"), sentAheadSQL
	}
	err := q.QueryRowContext(ctx, `SELECT
		p.n, p.bytes,
		max_pending_count, max_pending_bytes,
		(SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL),
		(SELECT count(*) FROM outbox WHERE seq <= st.sent_seq AND dead_at IS NULL) + `+sentAhead+`,
		p.oldest,
		coalesce((SELECT owner FROM outbox_lease WHERE name = 'relay'), ''),
		(SELECT expires_at FROM outbox_lease WHERE name = 'relay' AND owner <> '' AND expires_at > 0)
		FROM outbox_state st, (SELECT count(*) AS n, coalesce(sum(length(CAST(o.payload AS BLOB))), 0) AS bytes, min(o.created_at) AS oldest
			FROM outbox o, outbox_state st WHERE st.id = 1 AND o.seq > st.sent_seq AND `+pending+`) p
		WHERE st.id = 1`).Scan(
		&s.Pending, &s.PendingBytes, &s.MaxPendingMessages, &s.MaxPendingBytes,
		&s.Dead, &s.Sent, nullMillis{&s.OldestPending}, &s.LeaseOwner, nullMillis{&s.LeaseExpires})
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	if s.SchemaVersion >= 5 {
		// Read apart, as below. Expired rows are parked like dead ones
		// (dead_at set), few, and found through the outbox_dead index.
		err := q.QueryRowContext(ctx, `SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL AND expired`).Scan(&s.Expired)
		if err != nil {
			return Stats{}, fmt.Errorf("outbox: stats: %w", err)
		}
		s.Dead -= s.Expired
	}
	if s.SchemaVersion >= 4 && s.LeaseOwner != "" {
		// Read apart: a file of an older schema, read as it is, has no
		// such column.
		err := q.QueryRowContext(ctx, `SELECT coalesce((SELECT protocol FROM outbox_lease WHERE name = 'relay'), '')`).Scan(&s.LeaseProtocol)
		if err != nil {
			return Stats{}, fmt.Errorf("outbox: stats: %w", err)
		}
	}
	if s.SchemaVersion >= 8 && s.LeaseOwner != "" {
		err := q.QueryRowContext(ctx, `SELECT coalesce(broker_says, ''), broker_says_since,
			coalesce(no_subscribers, 0), coalesce(no_subscribers_topic, ''), no_subscribers_at FROM outbox_lease WHERE name = 'relay'`).Scan(
			&s.LeaseBrokerUnavailable, nullMillis{&s.LeaseBrokerUnavailableSince},
			&s.LeaseNoSubscribers, &s.LeaseNoSubscribersTopic, nullMillis{&s.LeaseNoSubscribersAt})
		if err != nil {
			return Stats{}, fmt.Errorf("outbox: stats: %w", err)
		}
	}
	if err := readStatsPriorities(ctx, q, &s); err != nil {
		return Stats{}, err
	}
	if err := readCommandStats(ctx, q, s.SchemaVersion, &s.Commands); err != nil {
		return Stats{}, err
	}
	return s, nil
}

// Record is one row of the outbox table.
type Record struct {
	Seq         int64
	ID          string
	Topic       string
	Type        string
	ContentType string
	Size        int    // payload bytes
	Payload     []byte // only when ListOptions.WithPayload
	State       State
	Attempts    int
	LastError   string
	CreatedAt   time.Time
	SentAt      time.Time // zero unless sent: when the relay recorded the acknowledgement
	DeadAt      time.Time // zero unless dead or expired: when it was parked
	Priority    int       // Message.Priority; 0 in a file of a schema before priorities
}

// ListOptions selects rows for List.
type ListOptions struct {
	State       State // empty means pending
	AfterSeq    int64 // rows with a larger sequence number only, for paging
	Limit       int   // zero means 100
	WithPayload bool  // payloads are left out unless asked for
	// Priority, if set, selects the messages of that priority (0 to
	// MaxPriority) only.
	Priority *int
}

// List returns outbox rows in sequence order.
func (o *Outbox) List(ctx context.Context, opts ListOptions) ([]Record, error) {
	state := opts.State
	if state == "" {
		state = StatePending
	}
	// state is the view's (outbox_messages), and where also selects by seq,
	// so that SQLite reads a range: pending rows lie above the common mark,
	// sent ones at or below the highest mark.
	var where string
	switch state {
	case StatePending:
		where = `seq > max(?, (SELECT sent_seq FROM outbox_state WHERE id = 1)) AND dead_at IS NULL AND state = 'pending'`
	case StateSent:
		highest := `sent_seq`
		if o.schema >= 9 {
			highest = `max(sent_seq, sent_seq_0, sent_seq_1, sent_seq_2, sent_seq_3, sent_seq_4, sent_seq_5, sent_seq_6, sent_seq_7, sent_seq_8, sent_seq_9)`
		}
		where = `seq > ? AND seq <= (SELECT ` + highest + ` FROM outbox_state WHERE id = 1) AND dead_at IS NULL AND state = 'sent'`
	case StateDead, StateExpired:
		// state is the view's: a file of an older schema, read as it is,
		// has no expired column, and no expired row.
		where = `dead_at IS NOT NULL AND state = '` + string(state) + `' AND seq > ?`
	default:
		return nil, fmt.Errorf("outbox: list: unknown state %q", state)
	}
	if opts.Priority != nil {
		w, err := o.listPriority(*opts.Priority)
		if err != nil {
			return nil, err
		}
		where += w
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = 100
	}
	payload := `NULL`
	if opts.WithPayload {
		payload = `payload`
	}
	priority := o.priorityColumn()
	// The view outbox_messages derives state and sent_at (schema 2 has no
	// such columns).
	rows, err := o.db.QueryContext(ctx, `SELECT seq, id, topic, type, content_type, length(CAST(payload AS BLOB)), `+payload+`,
		attempts, coalesce(last_error, ''), created_at, sent_at, dead_at, `+priority+`
		FROM outbox_messages WHERE `+where+` ORDER BY seq LIMIT ?`, opts.AfterSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r := Record{State: state}
		if err := rows.Scan(&r.Seq, &r.ID, &r.Topic, &r.Type, &r.ContentType, &r.Size, &r.Payload,
			&r.Attempts, &r.LastError, millis{&r.CreatedAt}, nullMillis{&r.SentAt}, nullMillis{&r.DeadAt}, &r.Priority); err != nil {
			return nil, fmt.Errorf("outbox: list: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: list: %w", err)
	}
	return out, nil
}

// Get returns the row with the given id, or an error wrapping ErrNotFound.
// UUIDv7 ids are not indexed (an index would cost every Enqueue a page
// write), so Get reads the table from the newest row back, in time that
// grows with the rows kept (BenchmarkGet100k).
func (o *Outbox) Get(ctx context.Context, id string) (Record, error) {
	var r Record
	var state string
	err := o.db.QueryRowContext(ctx, `SELECT seq, id, topic, type, content_type, length(CAST(payload AS BLOB)),
		state, attempts, coalesce(last_error, ''), created_at, sent_at, dead_at, `+o.priorityColumn()+`
		FROM outbox_messages WHERE id = ? ORDER BY seq DESC LIMIT 1`, id).Scan(
		&r.Seq, &r.ID, &r.Topic, &r.Type, &r.ContentType, &r.Size,
		&state, &r.Attempts, &r.LastError, millis{&r.CreatedAt}, nullMillis{&r.SentAt}, nullMillis{&r.DeadAt}, &r.Priority)
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, fmt.Errorf("%w: no message with id %q", ErrNotFound, id)
	}
	if err != nil {
		return Record{}, fmt.Errorf("outbox: get: %w", err)
	}
	r.State = State(state)
	return r, nil
}

// priorityColumn is the view's priority column, or 0 in a file of an older
// schema, read as it is.
func (o *Outbox) priorityColumn() string {
	if o.schema < 9 {
		return `0`
	}
	return `priority`
}

// Requeue makes the dead or expired messages with the given ids pending
// again and wakes the relay. A requeued message keeps its id, payload and
// creation time, gets a new sequence number — it goes out after everything
// pending now, as the relay only moves forward — and starts again with no
// attempts and no expiry.
// The outbox's limits apply: when it is full, Requeue fails with ErrFull and
// requeues nothing. It returns how many were requeued.
func (o *Outbox) Requeue(ctx context.Context, ids ...string) (int64, error) {
	if o.readOnly {
		return 0, ErrReadOnly
	}
	if len(ids) == 0 {
		return 0, nil
	}
	var total int64
	for start := 0; start < len(ids); start += 500 {
		chunk := ids[start:min(start+500, len(ids))]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		n, err := o.requeue(ctx, `dead_at IS NOT NULL AND id IN (`+placeholders(len(chunk))+`)`, args...)
		total += n
		if err != nil {
			return total, err
		}
	}
	o.wake.notify()
	return total, nil
}

// RequeueDead makes every dead message pending again; see Requeue. Expired
// messages stay as they are (RequeueExpired).
func (o *Outbox) RequeueDead(ctx context.Context) (int64, error) {
	if o.readOnly {
		return 0, ErrReadOnly
	}
	n, err := o.requeue(ctx, `dead_at IS NOT NULL AND NOT expired`)
	o.wake.notify()
	return n, err
}

// RequeueExpired makes every expired message pending again, without its
// expiry: it will be published however late; see Requeue.
func (o *Outbox) RequeueExpired(ctx context.Context) (int64, error) {
	if o.readOnly {
		return 0, ErrReadOnly
	}
	n, err := o.requeue(ctx, `dead_at IS NOT NULL AND expired`)
	o.wake.notify()
	return n, err
}

// requeue moves the dead rows that where selects to the end of the queue,
// in their order, in one transaction: each keeps its row (so a chosen id
// never meets itself in the unique index) and gets a number above every one
// used. The limits are checked first, counted as the insert trigger counts
// them.
func (o *Outbox) requeue(ctx context.Context, where string, args ...any) (int64, error) {
	var n int64
	err := runTx(ctx, o.db, func(tx *sql.Tx) error {
		var count, bytes int64
		if err := tx.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(length(CAST(payload AS BLOB))), 0) FROM outbox WHERE `+where, args...).Scan(&count, &bytes); err != nil {
			return err
		}
		if count == 0 {
			return nil
		}
		var maxCount, maxBytes, pending, pendingBytes int64
		if err := tx.QueryRowContext(ctx, `SELECT max_pending_count, max_pending_bytes,
			max(coalesce((SELECT max(seq) FROM outbox), 0), seq_floor, sent_seq) - sent_seq - skipped, pending_bytes
			FROM outbox_state WHERE id = 1`).Scan(&maxCount, &maxBytes, &pending, &pendingBytes); err != nil {
			return err
		}
		if maxCount > 0 && pending+count > maxCount {
			return fmt.Errorf("%w: %d pending and %d to requeue, limit %d messages", ErrFull, pending, count, maxCount)
		}
		if maxBytes > 0 && pendingBytes+bytes > maxBytes {
			return fmt.Errorf("%w: %d bytes pending and %d to requeue, limit %d bytes", ErrFull, pendingBytes, bytes, maxBytes)
		}
		res, err := tx.ExecContext(ctx, `UPDATE outbox SET seq = r.new_seq, dead_at = NULL, attempts = 0, last_error = NULL,
			expires_at = NULL, expired = 0
			FROM (SELECT seq AS old_seq, row_number() OVER (ORDER BY seq)
					+ (SELECT max(coalesce((SELECT max(seq) FROM outbox), 0), seq_floor, sent_seq) FROM outbox_state WHERE id = 1) AS new_seq
				FROM outbox WHERE `+where+`) AS r
			WHERE outbox.seq = r.old_seq`, args...)
		if err != nil {
			return classifyWriteErr(err)
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: requeue: %w", err)
	}
	return n, nil
}

// PurgeDead deletes every dead or expired message and returns how many.
func (o *Outbox) PurgeDead(ctx context.Context) (int64, error) {
	if o.readOnly {
		return 0, ErrReadOnly
	}
	return txn.InBatches(ctx, o.db, `DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE dead_at IS NOT NULL LIMIT ?)`, txn.BatchRows)
}

// PurgeSent deletes sent messages acknowledged before the given time and
// returns how many. The relay does this by itself for its retention period.
func (o *Outbox) PurgeSent(ctx context.Context, before time.Time) (int64, error) {
	if o.readOnly {
		return 0, ErrReadOnly
	}
	cuts, err := sentCuts(ctx, o.db, before.UnixMilli(), math.MaxInt64)
	if err != nil {
		return 0, err
	}
	return purgeSent(ctx, o.db, cuts)
}

// purgeSent deletes the sent rows up to each priority's cut (sentCuts), in
// bounded batches, and the marks that no longer cover a row. Marks are per
// priority: each priority's rows are cut at its own mark, so that a pending
// row of another priority, below a newer mark of this one, stays.
func purgeSent(ctx context.Context, db txn.Execer, cuts [MaxPriority + 1]int64) (int64, error) {
	var total int64
	for p, cut := range cuts {
		if cut == 0 {
			continue
		}
		n, err := txn.InBatches(ctx, db, `DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox
			WHERE `+liveOfSQL(p)+` AND seq <= ? LIMIT ?)`, cut, txn.BatchRows)
		total += n
		if err != nil {
			return total, err
		}
		if _, err := db.ExecContext(ctx, `DELETE FROM outbox_sent_log WHERE priority = ? AND seq < ?`, p, cut); err != nil {
			return total, fmt.Errorf("outbox: purge: %w", classifyWriteErr(err))
		}
	}
	return total, nil
}

// sentCuts is, for each priority, the newest of its marks recorded before
// beforeMS or after futureMS (0: none), read from the log in one pass.
func sentCuts(ctx context.Context, db querier, beforeMS, futureMS int64) (cuts [MaxPriority + 1]int64, err error) {
	rows, err := db.QueryContext(ctx, `SELECT priority, max(seq) FROM outbox_sent_log
		WHERE sent_at < ? OR sent_at > ? GROUP BY priority`, beforeMS, futureMS)
	if err != nil {
		return cuts, fmt.Errorf("outbox: purge: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var p, seq int64
		if err := rows.Scan(&p, &seq); err != nil {
			return cuts, err
		}
		if p >= 0 && p <= MaxPriority {
			cuts[p] = seq
		}
	}
	return cuts, rows.Err()
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

// millis scans Unix milliseconds into a time.Time.
type millis struct{ t *time.Time }

func (m millis) Scan(v any) error {
	n, ok := v.(int64)
	if !ok {
		return fmt.Errorf("expected integer milliseconds, got %T", v)
	}
	*m.t = time.UnixMilli(n)
	return nil
}

// nullMillis is millis that leaves a NULL as the zero time.
type nullMillis struct{ t *time.Time }

func (m nullMillis) Scan(v any) error {
	if v == nil {
		*m.t = time.Time{}
		return nil
	}
	return millis(m).Scan(v)
}
