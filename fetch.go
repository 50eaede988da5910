package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// The relay's reads: pending rows of one priority in sequence order,
// encoded for the session's connection; which priorities have any; and
// the wait for more.

// maxBatchBytes bounds the payload bytes read per batch, so a backlog of
// large messages never sits in memory at once.
const maxBatchBytes = 4 << 20

// maxBatchPrealloc bounds the rows a read makes room for before it knows
// how many there are: growing the batch row by row copied it about twice.
const maxBatchPrealloc = 1024

// row is an outbox row read for publishing, already encoded.
type row struct {
	outgoing
	encoded []byte            // the message as it will be published
	props   PublishProperties // given only when the session carries properties
	encErr  error
	doc     []byte // binary mode's row as a structured document, for a batch (member)
	// priority is the row's; a read holds rows of one priority.
	priority uint8
	// expires is when the message expires, on the outbox clock (NULL:
	// never).
	expires sql.NullInt64
}

// rowBatch is a batch read as durable.Commits sees it.
type rowBatch []row

func (b rowBatch) Len() int                         { return len(b) }
func (b rowBatch) Row(i int) (seq int64, id string) { return b[i].seq, b[i].id }

// fetch reads up to limit pending rows of priority prio after cursor, with
// the data_version read before them (so a commit after the read is never
// missed), encoded for a connection that carries MQTT 5 properties or not
// (carries). more reports that it stopped at limit or at maxBatchBytes:
// there may be more.
func (r *Relay) fetch(ctx context.Context, conn *sqlconn.Conn, prio int, cursor int64, limit int, carries bool) (version int64, out []row, more bool, err error) {
	err = conn.Do(func(c *sql.Conn) error {
		var err error
		if version, err = dataVersion(ctx, conn, c); err != nil {
			return err
		}
		st, err := conn.Stmt(ctx, c, readSQLs[prio])
		if err != nil {
			return err
		}
		rows, err := st.QueryContext(ctx, cursor, limit, MaxPayloadBytesLimit)
		if err != nil {
			return err
		}
		defer rows.Close()
		bytes := 0
		out = make([]row, 0, min(limit, maxBatchPrealloc))
		for rows.Next() {
			m := row{priority: uint8(prio)}
			var payload sql.RawBytes
			var form int64
			if err := rows.Scan(&m.seq, &m.id, &m.topic, &payload, &form, &m.typ, &m.contentType, &m.createdAt, &m.attempts, &m.expires, &m.correlation); err != nil {
				return err
			}
			if form < 0 {
				size, lim := -form>>32, -form&(1<<32-1)
				m.encErr = undeliverable(fmt.Errorf("%w: %d bytes, over the limit of %d stored in the database", ErrPayloadTooLarge, size, lim))
				out = append(out, m)
				continue
			}
			m.text = form == 1
			m.payload = payload
			r.enc.encodeRow(&m, carries)
			m.payload = nil // RawBytes is only valid until Next
			out = append(out, m)
			bytes += len(m.encoded)
			if bytes >= maxBatchBytes {
				more = true
				break
			}
		}
		return rows.Err()
	})
	return version, out, more || len(out) >= limit, err
}

// readSQLs read the pending rows of each priority after a cursor, in seq
// order. A payload over the stored limit (a plain-SQL row from before the
// limit, or one the limit was lowered under) is not read: its length is in
// the record's header (octet_length reads only that), and the row is
// parked dead as it is. (The park's UPDATE still has SQLite copy the row
// once, as any UPDATE rewrites a whole row.) A priority above 0 is read
// from the outbox_priority index, whose WHERE the query repeats so that
// SQLite uses it; priority 0 by seq, past the other priorities' rows.
//
// The payload's form is one column, since each column read costs about as
// much as a mark's share of a row: 1 for TEXT, 0 for a BLOB, and for a
// payload over the limit −(length << 32 | limit), both under 2³¹.
var readSQLs = func() (q [MaxPriority + 1]string) {
	for p := range q {
		where := fmt.Sprintf(`priority = %d AND priority > 0 AND dead_at IS NULL AND seq > max(?1, sent_seq, mark)`, p)
		if p == 0 {
			where = `seq > max(?1, sent_seq, mark) AND priority = 0 AND dead_at IS NULL`
		}
		q[p] = fmt.Sprintf(`SELECT seq, id, topic,
				CASE WHEN octet_length(payload) > lim THEN NULL ELSE payload END,
				CASE WHEN octet_length(payload) > lim THEN -((octet_length(payload) << 32) | lim) ELSE typeof(payload) = 'text' END,
				type, content_type, created_at, attempts, expires_at, correlation_data
			FROM outbox, (SELECT min(max_payload_bytes, ?3) AS lim, sent_seq, sent_seq_%d AS mark FROM outbox_state WHERE id = 1)
			WHERE %s
			ORDER BY seq LIMIT ?2`, p, where)
	}
	return q
}()

// pickSQL says which priorities have pending rows after the relay's
// cursor for each (?1 is priority 0's, ?10 priority 9's), as a bit set, and
// the newest seq, read in the same snapshot: a priority with nothing after
// its cursor has nothing up to that seq either. Each priority above 0 is an
// index seek. Priority 0 has no index (it would cost every enqueue): its
// row is looked for among the next pick0Walk rows; else, when every number
// after its cursor holds a dead row or one of another priority (counted in
// the outbox_dead and outbox_priority indexes, several times cheaper than
// reading the rows), there is none; else (gaps) the rows are read until
// one is found. Priority 0's cursor then moves to the newest seq
// (lanes.go), so that the others' rows are passed once.
var pickSQL = func() string {
	const c0 = `max(?1, st.sent_seq, st.sent_seq_0)`
	var b strings.Builder
	b.WriteString(`SELECT coalesce((SELECT max(seq) FROM outbox), 0), 0`)
	for p := MaxPriority; p > 0; p-- {
		fmt.Fprintf(&b, `
	| (EXISTS (SELECT 1 FROM outbox WHERE priority = %d AND priority > 0 AND dead_at IS NULL AND seq > max(?%d, st.sent_seq, st.sent_seq_%d)) << %d)`, p, p+1, p, p)
	}
	others := `(SELECT count(*) FROM outbox WHERE seq > ` + c0 + ` AND dead_at IS NOT NULL)`
	for p := 1; p <= MaxPriority; p++ {
		others += fmt.Sprintf(`
			+ (SELECT count(*) FROM outbox WHERE priority = %d AND priority > 0 AND dead_at IS NULL AND seq > %s)`, p, c0)
	}
	fmt.Fprintf(&b, `
	| CASE
		WHEN EXISTS (SELECT 1 FROM (SELECT priority, dead_at FROM outbox WHERE seq > %[1]s ORDER BY seq LIMIT %[2]d)
			WHERE priority = 0 AND dead_at IS NULL) THEN 1
		WHEN coalesce((SELECT max(seq) FROM outbox), 0) - %[1]s = %[3]s THEN 0
		ELSE EXISTS (SELECT 1 FROM outbox WHERE seq > %[1]s AND priority = 0 AND dead_at IS NULL) END
	FROM outbox_state st WHERE st.id = 1`, c0, pick0Walk, others)
	return b.String()
}()

// pick0Walk is how many rows pick reads for one of priority 0 before it
// counts instead.
const pick0Walk = 64

// pick reads which priorities have rows after their cursors (pickSQL),
// with the data_version read before; unless it must, only if conn is free
// (done).
func (r *Relay) pick(ctx context.Context, conn *sqlconn.Conn, cursors *[MaxPriority + 1]int64, must bool) (version, top int64, pending uint16, done bool, err error) {
	do := func(fn func(*sql.Conn) error) (bool, error) { return true, conn.Do(fn) }
	if !must {
		do = conn.TryDo
	}
	done, err = do(func(c *sql.Conn) error {
		var err error
		if version, err = dataVersion(ctx, conn, c); err != nil {
			return err
		}
		st, err := conn.Stmt(ctx, c, pickSQL)
		if err != nil {
			return err
		}
		args := make([]any, len(cursors))
		for i, cur := range cursors {
			args[i] = cur
		}
		var bits int64
		if err := st.QueryRowContext(ctx, args...).Scan(&top, &bits); err != nil {
			return err
		}
		pending = uint16(bits)
		return nil
	})
	return version, top, pending, done, err
}

// dataVersion reads PRAGMA data_version on conn (inside its Do): it
// changes when another connection commits.
func dataVersion(ctx context.Context, conn *sqlconn.Conn, c *sql.Conn) (int64, error) {
	dv, err := conn.Stmt(ctx, c, `PRAGMA data_version`)
	if err != nil {
		return 0, err
	}
	var v int64
	return v, dv.QueryRowContext(ctx).Scan(&v)
}

// waitForWork waits until a commit may have added rows: an in-process
// notification, a change of data_version (another connection or process
// committed), or the end of ctx (false).
func (r *Relay) waitForWork(ctx context.Context, conn *sqlconn.Conn, wake <-chan struct{}, version int64) bool {
	return r.watch.Wait(ctx, wake, func(ctx context.Context) (bool, bool) { return r.committed(ctx, conn, version) }, r.hearsAll.Load)
}

// committed reports whether another connection committed since version was
// read; ok is false when ctx ended.
func (r *Relay) committed(ctx context.Context, conn *sqlconn.Conn, version int64) (changed, ok bool) {
	var v int64
	call(r.hooks.onAsk)
	err := conn.Do(func(c *sql.Conn) (err error) {
		v, err = dataVersion(ctx, conn, c)
		return err
	})
	if err != nil || v != version {
		return true, ctx.Err() == nil
	}
	return false, true
}

// batch is one read of the outbox: rows of one priority.
type batch struct {
	prio    int
	wake    <-chan struct{} // taken before the read: closed by a later commit
	version int64           // data_version before the read
	rows    []row
	more    bool     // the read stopped at its limit: there may be more
	parcels []parcel // rows as they are published
	rules   parcelRules
	err     error
	// ticket is the gate's after the read: a sync numbered above it makes
	// the rows durable (makeDurable).
	ticket int64
}

// fetch reads up to limit pending rows of prio after cursor, ahead of
// their turn, packs them, and makes them durable by the time dispatch
// wants them (need closed): makeDurable.
func (s *session) fetch(prio int, cursor int64, limit int, rules parcelRules, need <-chan struct{}) batch {
	b := s.read(prio, cursor, limit)
	s.pack(&b, rules)
	s.makeDurable(&b, need)
	return b
}

// pack packs b's rows.
func (s *session) pack(b *batch, rules parcelRules) {
	if b.err == nil {
		b.parcels = s.r.pack(b.rows, rules)
		b.rules = rules
	}
}

// read reads up to limit pending rows of prio after cursor.
func (s *session) read(prio int, cursor int64, limit int) batch {
	b := batch{prio: prio, wake: s.r.ob.wake.wait()}
	b.version, b.rows, b.more, b.err = s.r.fetch(s.dctx, s.r.reader, prio, cursor, limit, s.props != nil)
	b.ticket = s.gate.Ticket()
	return b
}

// makeDurable makes b's rows durable before they are published, by the
// time need is closed (at once if need is nil).
//
// Durable before publish: a commit made at synchronous=NORMAL is in the WAL
// but not yet on the disk, and a power cut would undo it after the broker
// had its event (a phantom, and its seq given to the next commit). An fsync
// of the WAL begun after the read makes every row it saw durable, and the
// relay's own marks before it. A batch read ahead waits for the gate's next
// sync of the marks (each sync is numbered: durable.Gate.Covered), which
// usually comes while the batch before it is published, and syncs itself
// only if dispatch wants it first and none is under way. Rows that
// Transact committed at FULL are durable already, and so is every row when
// all writers are declared at FULL; the marks are then the gate's to sync.
// (Covers is asked first either way: it forgets the ranges the relay has
// read past.)
func (s *session) makeDurable(b *batch, need <-chan struct{}) {
	if b.err != nil || len(b.rows) == 0 || s.r.ob.durable.Covers(rowBatch(b.rows)) || s.r.opts.WritersAtFull {
		return
	}
	wanted := need == nil
	for {
		ended := s.gate.Ended()
		// Running is asked first: a sync that ends between the two looks
		// is then seen covering, not taken for none.
		running := s.gate.Running(b.ticket)
		if s.gate.Covered(b.ticket) {
			return
		}
		if wanted && !running {
			break
		}
		select {
		case <-ended:
		case <-need:
			wanted, need = true, nil
		case <-s.dctx.Done():
			// Never published: the session is over.
			b.rows, b.err = nil, context.Cause(s.dctx)
			return
		}
	}
	if err := s.gate.SyncNow(); err != nil {
		b.rows, b.err = nil, fmt.Errorf("outbox: relay: making the outbox durable before publishing: %w", err)
	}
}
