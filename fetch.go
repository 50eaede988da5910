package outbox

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// The relay's reads: pending rows in sequence order, encoded for the
// session's connection, and the wait for more.

// maxBatchBytes bounds the payload bytes read per batch, so a backlog of
// large messages never sits in memory at once.
const maxBatchBytes = 4 << 20

// row is an outbox row read for publishing, already encoded.
type row struct {
	outgoing
	encoded []byte            // the message as it will be published
	props   PublishProperties // given only when the session carries properties
	encErr  error
	doc     []byte // binary mode's row as a structured document, for a batch (member)
	// expires is when the message expires, on the outbox clock (NULL:
	// never).
	expires sql.NullInt64
}

// rowBatch is a batch read as durable.Commits sees it.
type rowBatch []row

func (b rowBatch) Len() int                         { return len(b) }
func (b rowBatch) Row(i int) (seq int64, id string) { return b[i].seq, b[i].id }

// fetch reads up to limit pending rows after cursor, with the data_version
// read before them (so a commit after the read is never missed), encoded
// for a connection that carries MQTT 5 properties or not (carries).
func (r *Relay) fetch(ctx context.Context, conn *sqlconn.Conn, cursor int64, limit int, carries bool) (int64, []row, error) {
	var version int64
	var out []row
	err := conn.Do(func(c *sql.Conn) error {
		dv, err := conn.Stmt(ctx, c, `PRAGMA data_version`)
		if err != nil {
			return err
		}
		if err := dv.QueryRowContext(ctx).Scan(&version); err != nil {
			return err
		}
		// A payload over the stored limit (a plain-SQL row from before the
		// limit, or one the limit was lowered under) is not read: its
		// length is in the record's header (octet_length reads only that),
		// and the row is parked dead as it is. (The park's UPDATE still has
		// SQLite copy the row once, as any UPDATE rewrites a whole row.)
		st, err := conn.Stmt(ctx, c, `SELECT seq, id, topic,
				CASE WHEN octet_length(payload) > lim THEN NULL ELSE payload END, octet_length(payload), lim,
				typeof(payload) = 'text', type, content_type, created_at, attempts, expires_at
			FROM outbox, (SELECT min(max_payload_bytes, ?3) AS lim, sent_seq FROM outbox_state WHERE id = 1)
			WHERE seq > max(?1, sent_seq) AND dead_at IS NULL
			ORDER BY seq LIMIT ?2`)
		if err != nil {
			return err
		}
		rows, err := st.QueryContext(ctx, cursor, limit, MaxPayloadBytesLimit)
		if err != nil {
			return err
		}
		defer rows.Close()
		bytes := 0
		for rows.Next() {
			var m row
			var payload sql.RawBytes
			var size, lim int64
			if err := rows.Scan(&m.seq, &m.id, &m.topic, &payload, &size, &lim, &m.text, &m.typ, &m.contentType, &m.createdAt, &m.attempts, &m.expires); err != nil {
				return err
			}
			if size > lim {
				m.encErr = undeliverable(fmt.Errorf("%w: %d bytes, over the limit of %d stored in the database", ErrPayloadTooLarge, size, lim))
				out = append(out, m)
				continue
			}
			m.payload = payload
			r.enc.encodeRow(&m, carries)
			m.payload = nil // RawBytes is only valid until Next
			out = append(out, m)
			bytes += len(m.encoded)
			if bytes >= maxBatchBytes {
				break
			}
		}
		return rows.Err()
	})
	return version, out, err
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
	err := conn.Do(func(c *sql.Conn) error {
		dv, err := conn.Stmt(ctx, c, `PRAGMA data_version`)
		if err != nil {
			return err
		}
		return dv.QueryRowContext(ctx).Scan(&v)
	})
	if err != nil || v != version {
		return true, ctx.Err() == nil
	}
	return false, true
}

// batch is one read of the outbox.
type batch struct {
	wake    <-chan struct{} // taken before the read: closed by a later commit
	version int64           // data_version before the read
	rows    []row
	parcels []parcel // rows as they are published
	rules   parcelRules
	err     error
}

// fetch reads up to limit pending rows after cursor, and packs them.
func (s *session) fetch(cursor int64, limit int, rules parcelRules) batch {
	b := s.read(cursor, limit)
	s.pack(&b, rules)
	return b
}

// pack makes b's rows durable and packs them.
func (s *session) pack(b *batch, rules parcelRules) {
	s.makeDurable(b)
	if b.err == nil {
		b.parcels = s.r.pack(b.rows, rules)
		b.rules = rules
	}
}

// read reads up to limit pending rows after cursor.
func (s *session) read(cursor int64, limit int) batch {
	b := batch{wake: s.r.ob.wake.wait()}
	b.version, b.rows, b.err = s.r.fetch(s.dctx, s.r.reader, cursor, limit, s.props != nil)
	return b
}

// makeDurable makes b's rows durable before they are published.
func (s *session) makeDurable(b *batch) {
	if b.err == nil && len(b.rows) > 0 && !s.r.ob.durable.Covers(rowBatch(b.rows)) && !s.r.opts.WritersAtFull {
		// Durable before publish: a commit made at synchronous=NORMAL is
		// in the WAL but not yet on the disk, and a power cut would undo
		// it after the broker had its event (a phantom, and its seq given
		// to the next commit). One fsync per batch read makes every row of
		// the batch, and the relay's own marks before it, durable. Rows
		// that Transact committed at FULL are durable already, and so is
		// every row when all writers are declared at FULL; the marks are
		// then the gate's to sync. (covers is asked first either way: it
		// forgets the ranges the relay has read past.)
		if err := s.gate.SyncNow(); err != nil {
			b.rows, b.err = nil, fmt.Errorf("outbox: relay: making the outbox durable before publishing: %w", err)
		}
	}
}
