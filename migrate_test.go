package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/migrate"
)

// openV1 returns a database with the outbox schema of version 1 only.
func openV1(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "v1.db")
	db, err := OpenDB(path, DBOptions{})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, migrate.SQLite(context.Background(), db, "outbox_schema", outboxMigrations[:1], "", ErrSchemaTooNew))
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
			MaxPendingMessages: 100, MaxPendingBytes: 1000, SchemaVersion: SchemaVersion, LeaseExpires: st.LeaseExpires,
			Priorities: []PriorityStats{{Priority: 0, Pending: 3, OldestPending: st.OldestPending}}}, st)
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
		migrated := migratedFrom(t, ``)
		fresh := openTest(t, Options{})
		require.Equal(t, schemaObjects(t, fresh.DB()), schemaObjects(t, migrated.DB()))
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

// TestMigrationLeaseProtocol: schema 4 gives the lease a protocol column,
// NULL in a migrated file and until a relay connects; a relay that has
// connected shows its version to Stats, which another process reads.
func TestMigrationLeaseProtocol(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v3.db")
	db, err := OpenDB(path, DBOptions{})
	require.NoError(t, err)
	require.NoError(t, migrate.SQLite(context.Background(), db, "outbox_schema", outboxMigrations[:3], "", ErrSchemaTooNew))
	// What a schema 3 relay that crashed leaves: a lease held.
	_, err = db.Exec(`INSERT INTO outbox_lease (name, owner, token, expires_at) VALUES ('relay', 'old-relay', 7, 1000)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	ob := openTestPath(t, path, Options{})
	var protocol sql.NullString
	require.NoError(t, ob.DB().QueryRow(`SELECT protocol FROM outbox_lease WHERE name = 'relay'`).Scan(&protocol))
	require.False(t, protocol.Valid, "not known after the migration")
	st, err := ob.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, "old-relay", st.LeaseOwner)
	require.Empty(t, st.LeaseProtocol)
	require.Equal(t, SchemaVersion, st.SchemaVersion)
}

// schemaObjects describes a database's schema for comparison: every table's
// columns (name, type, NOT NULL, default, primary key), and the SQL of every
// index, trigger and view with its white space folded. A table's own CREATE
// text is left out: ALTER TABLE ADD COLUMN rewrites it.
func schemaObjects(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_schema
		WHERE name NOT LIKE 'sqlite_%' AND name NOT IN ('orders') ORDER BY type, name`)
	require.NoError(t, err)
	type object struct{ typ, name, table, sql string }
	var objects []object
	for rows.Next() {
		var o object
		require.NoError(t, rows.Scan(&o.typ, &o.name, &o.table, &o.sql))
		objects = append(objects, o)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	var out []string
	for _, o := range objects {
		if o.typ != "table" {
			out = append(out, o.typ+" "+o.name+" on "+o.table+": "+strings.Join(strings.Fields(o.sql), " "))
			continue
		}
		cols, err := db.Query(`SELECT name, type, "notnull", coalesce(dflt_value, 'NULL'), pk FROM pragma_table_xinfo(?)`, o.name)
		require.NoError(t, err)
		for cols.Next() {
			var name, typ, dflt string
			var notNull, pk int
			require.NoError(t, cols.Scan(&name, &typ, &notNull, &dflt, &pk))
			out = append(out, fmt.Sprintf("table %s column %s %s notnull=%d default=%s pk=%d", o.name, name, typ, notNull, dflt, pk))
		}
		require.NoError(t, cols.Err())
		cols.Close()
	}
	return out
}

// appObjects is what an application may keep beside the outbox: a trigger
// on its own table that writes the event (a good way to write events), a
// trigger on the outbox, and a view over it.
const appObjects = `
	CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL);
	CREATE TABLE audit (topic TEXT);
	CREATE TRIGGER orders_event AFTER INSERT ON orders
	BEGIN INSERT INTO outbox (topic, payload) VALUES ('orders', json_object('order', NEW.id)); END;
	CREATE TRIGGER outbox_audit AFTER INSERT ON outbox BEGIN INSERT INTO audit VALUES (NEW.topic); END;
	CREATE VIEW order_events AS SELECT topic, payload FROM outbox WHERE topic = 'orders';
	INSERT INTO orders (item) VALUES ('before');`

// checkAppObjects checks that appObjects work on ob's database.
func checkAppObjects(t *testing.T, ob *Outbox, before int) {
	t.Helper()
	_, err := ob.DB().Exec(`INSERT INTO orders (item) VALUES ('after')`)
	require.NoError(t, err)
	var events, audited int
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM order_events`).Scan(&events))
	require.Equal(t, before+1, events, "the application's trigger writes events, its view reads them")
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM audit`).Scan(&audited))
	require.Equal(t, before+1, audited, "the application's trigger on the outbox is still there")
	checkCounters(t, ob.DB())
}

// TestMigrationKeepsApplicationObjects: migrating used to fail when the
// application had a trigger or a view that names the outbox ("error in
// trigger orders_event: no such table: main.outbox"), and a trigger on the
// outbox would have gone with the old table.
func TestMigrationKeepsApplicationObjects(t *testing.T) {
	t.Run("from schema 1", func(t *testing.T) {
		ob := migratedFrom(t, appObjects)
		checkAppObjects(t, ob, 1)
	})
	t.Run("from schema 2", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "v2.db")
		db, err := OpenDB(path, DBOptions{})
		require.NoError(t, err)
		require.NoError(t, migrate.SQLite(context.Background(), db, "outbox_schema", outboxMigrations[:2], "", ErrSchemaTooNew))
		_, err = db.Exec(appObjects)
		require.NoError(t, err)
		require.NoError(t, db.Close())
		checkAppObjects(t, openTestPath(t, path, Options{MaxPendingMessages: 10}), 1)
	})
	t.Run("from schema 3", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "v3.db")
		db, err := OpenDB(path, DBOptions{})
		require.NoError(t, err)
		require.NoError(t, migrate.SQLite(context.Background(), db, "outbox_schema", outboxMigrations[:3], "", ErrSchemaTooNew))
		_, err = db.Exec(appObjects)
		require.NoError(t, err)
		require.NoError(t, db.Close())
		checkAppObjects(t, openTestPath(t, path, Options{MaxPendingMessages: 10}), 1)
	})
	t.Run("a trigger the new schema cannot take fails the migration whole", func(t *testing.T) {
		path := openV1(t)
		db, err := OpenDB(path, DBOptions{})
		require.NoError(t, err)
		_, err = db.Exec(appObjects + `
			CREATE TRIGGER outbox_uses_state AFTER UPDATE ON outbox WHEN NEW.state = 'dead'
			BEGIN INSERT INTO audit VALUES ('dead'); END;`)
		require.NoError(t, err)
		require.NoError(t, db.Close())
		_, err = Open(context.Background(), path, Options{Logger: testLogger()})
		require.ErrorContains(t, err, "one of your triggers on outbox (outbox_audit, outbox_uses_state) does not compile on the new schema")
		db, err = OpenDB(path, DBOptions{})
		require.NoError(t, err)
		defer db.Close()
		v, err := readSchemaVersion(context.Background(), db)
		require.NoError(t, err)
		require.Equal(t, 1, v, "left as it was")
	})
}
