package outbox

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// openV1 returns a database with the outbox schema of version 1 only.
func openV1(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "v1.db")
	db, err := OpenDB(path, DBOptions{})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, migrateSet(context.Background(), db, "outbox_schema", migrations[:1], ""))
	return path
}

// migratedFrom writes a schema 1 database with setup (plain SQL), then
// opens it with the current code, which migrates it.
func migratedFrom(t *testing.T, setup string) *Outbox {
	t.Helper()
	path := openV1(t)
	db, err := OpenDB(path, DBOptions{})
	require.NoError(t, err)
	_, err = db.Exec(setup)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	return openTestPath(t, path, Options{})
}

// openTestPath is openTest on an existing file.
func openTestPath(t *testing.T, path string, opts Options) *Outbox {
	t.Helper()
	opts.Logger = testLogger()
	ob, err := Open(context.Background(), path, opts)
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	_, err = ob.DB().Exec(`CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	require.NoError(t, err)
	return ob
}

type migratedRow struct {
	Seq      int64
	ID       string
	Payload  string
	State    string
	Attempts int
}

func migratedRows(t *testing.T, ob *Outbox) []migratedRow {
	t.Helper()
	rows, err := ob.DB().Query(`SELECT seq, id, CAST(payload AS TEXT), state, attempts FROM outbox_messages ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	var out []migratedRow
	for rows.Next() {
		var r migratedRow
		require.NoError(t, rows.Scan(&r.Seq, &r.ID, &r.Payload, &r.State, &r.Attempts))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestMigrationFromSchema1(t *testing.T) {
	ctx := context.Background()
	t.Run("states, order and limits", func(t *testing.T) {
		// What a schema 1 relay leaves: 1 and 4 sent, 2 dead, 3 requeued
		// (pending below a sent row), 5 and 6 pending.
		ob := migratedFrom(t, `
			INSERT INTO outbox (seq, id, topic, payload) VALUES
				(1, 'id-1', 't', 'p1'), (2, 'id-2', 't', 'p2'), (3, 'id-3', 't', 'p3'),
				(4, 'id-4', 't', 'p4'), (5, 'id-5', 't', 'p5'), (6, 'id-6', 't', 'p6');
			UPDATE outbox SET state = 'sent', sent_at = 1000 WHERE seq = 1;
			UPDATE outbox SET state = 'sent', sent_at = 3000 WHERE seq = 4;
			UPDATE outbox SET state = 'dead', attempts = 5, last_error = 'refused', dead_at = 2000 WHERE seq = 2;
			UPDATE outbox SET attempts = 2 WHERE seq = 3;
			UPDATE outbox_counters SET max_pending_count = 100, max_pending_bytes = 1000;`)
		require.Equal(t, []migratedRow{
			{1, "id-1", "p1", "sent", 0},
			{2, "id-2", "p2", "dead", 5},
			{4, "id-4", "p4", "sent", 0},
			{5, "id-5", "p5", "pending", 0},
			{6, "id-6", "p6", "pending", 0},
			{7, "id-3", "p3", "pending", 2}, // moved above the sent ones, id kept
		}, migratedRows(t, ob))
		st, err := ob.Stats(ctx)
		require.NoError(t, err)
		require.Equal(t, Stats{Pending: 3, PendingBytes: 6, OldestPending: st.OldestPending, Dead: 1, Sent: 2,
			MaxPendingMessages: 100, MaxPendingBytes: 1000, SchemaVersion: 2, LeaseExpires: st.LeaseExpires}, st)
		var pendingBytes int64
		require.NoError(t, ob.DB().QueryRow(`SELECT pending_bytes FROM outbox_state`).Scan(&pendingBytes))
		require.EqualValues(t, 6, pendingBytes, "the byte counter starts right")
		sent, err := ob.List(ctx, ListOptions{State: StateSent})
		require.NoError(t, err)
		require.Len(t, sent, 2)
		require.EqualValues(t, 3000, sent[1].SentAt.UnixMilli())

		opts := fastRelay()
		opts.Envelope = EnvelopeRaw
		pub := &fakePublisher{}
		r, err := ob.NewRelay(pub, opts)
		require.NoError(t, err)
		startRelay(t, r)
		eventually(t, 5*time.Second, "pending ones published", func() bool { return pub.publishedCount() == 3 })
		pub.mu.Lock()
		require.Equal(t, []string{"p5", "p6", "p3"}, pub.published, "only what was pending, in order")
		pub.mu.Unlock()
	})
	t.Run("numbers never reused", func(t *testing.T) {
		// Schema 1 deleted its newest rows (retention): its AUTOINCREMENT
		// counter is ahead of every row left.
		ob := migratedFrom(t, `
			INSERT INTO outbox (id, topic, payload) VALUES ('a', 't', 'a'), ('b', 't', 'b'), ('c', 't', 'c'), ('d', 't', 'd');
			UPDATE outbox SET state = 'sent', sent_at = 1 WHERE seq >= 3;
			DELETE FROM outbox WHERE seq >= 3;`)
		commitOrder(t, ob, "t", 1)
		rows := migratedRows(t, ob)
		require.Len(t, rows, 3)
		require.Equal(t, migratedRow{5, "a", "a", "pending", 0}, rows[0], "above the old counter, in order")
		require.Equal(t, migratedRow{6, "b", "b", "pending", 0}, rows[1])
		require.EqualValues(t, 7, rows[2].Seq)
	})
	t.Run("same objects as a new file", func(t *testing.T) {
		objects := func(ob *Outbox) []string {
			rows, err := ob.DB().Query(`SELECT type || ' ' || name || ' on ' || tbl_name FROM sqlite_schema
				WHERE name NOT LIKE 'sqlite_%' ORDER BY 1`)
			require.NoError(t, err)
			defer rows.Close()
			var out []string
			for rows.Next() {
				var o string
				require.NoError(t, rows.Scan(&o))
				out = append(out, o)
			}
			return out
		}
		migrated := migratedFrom(t, ``)
		fresh := openTest(t, Options{})
		require.Equal(t, objects(fresh), objects(migrated))
	})
	t.Run("empty", func(t *testing.T) {
		ob := migratedFrom(t, `INSERT INTO outbox (topic, payload) VALUES ('t', 'a'), ('t', 'b'); DELETE FROM outbox;`)
		commitOrder(t, ob, "t", 1)
		rows := migratedRows(t, ob)
		require.Len(t, rows, 1)
		require.EqualValues(t, 3, rows[0].Seq)
		require.Equal(t, "pending", rows[0].State)
	})
}
