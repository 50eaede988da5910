package outbox

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/migrate"
)

// TestPriorityColumn: the plain-SQL contract's priority column takes 0 to 9
// and refuses everything else at INSERT, whoever writes.
func TestPriorityColumn(t *testing.T) {
	ob := openTest(t, Options{})
	db := ob.DB()
	_, err := db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('t', 'default')`)
	require.NoError(t, err)
	for p := 0; p <= MaxPriority; p++ {
		_, err := db.Exec(`INSERT INTO outbox (topic, payload, priority) VALUES ('t', 'p', ?)`, p)
		require.NoError(t, err, "priority %d", p)
	}
	for _, bad := range []string{`10`, `-1`, `5.5`, `'9x'`, `NULL`, `'high'`, `x'09'`} {
		_, err := db.Exec(`INSERT INTO outbox (topic, payload, priority) VALUES ('t', 'p', ` + bad + `)`)
		require.Error(t, err, "priority %s", bad)
	}
	var n, sum int
	require.NoError(t, db.QueryRow(`SELECT count(*), sum(priority) FROM outbox`).Scan(&n, &sum))
	require.Equal(t, 11, n, "only the good ones")
	require.Equal(t, 45, sum, "the default is 0")
}

// TestEnqueuePriority: Message.Priority is stored and read back; out of
// range it is refused before anything is written, a good message before it
// in the same call included.
func TestEnqueuePriority(t *testing.T) {
	ctx := context.Background()
	ob := openTest(t, Options{})
	for _, bad := range []int{MaxPriority + 1, -1} {
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, Message{Topic: "t", Payload: []byte(`{}`)}, Message{Topic: "t", Priority: bad})
		})
		require.ErrorIs(t, err, ErrInvalidMessage, "priority %d", bad)
	}
	var rows int
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox`).Scan(&rows))
	require.Zero(t, rows, "nothing written")

	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
		return ob.Enqueue(ctx, tx,
			Message{Topic: "t", ID: "p0"},
			Message{Topic: "t", ID: "p9", Priority: 9, ContentType: "text/plain"},
			Message{Topic: "t", ID: "p3e", Priority: 3, Expiry: 3600e9})
	}))
	recs, err := ob.List(ctx, ListOptions{})
	require.NoError(t, err)
	require.Len(t, recs, 3)
	for i, want := range []int{0, 9, 3} {
		require.Equal(t, want, recs[i].Priority, recs[i].ID)
	}
	rec, err := ob.Get(ctx, "p9")
	require.NoError(t, err)
	require.Equal(t, 9, rec.Priority)
	require.Equal(t, "text/plain", rec.ContentType)
	var expires sql.NullInt64
	require.NoError(t, ob.DB().QueryRow(`SELECT expires_at FROM outbox WHERE id = 'p9'`).Scan(&expires))
	require.False(t, expires.Valid, "no expiry: none stored")
	require.NoError(t, ob.DB().QueryRow(`SELECT expires_at FROM outbox WHERE id = 'p3e'`).Scan(&expires))
	require.True(t, expires.Valid, "the expiry stored with the priority")
}

// TestMigrationToPriorities: a schema 8 file with sent, dead and pending rows
// keeps every row's state through the migration; every row gets priority 0,
// each priority's mark starts at the common one, and a new row is numbered
// above all of them.
func TestMigrationToPriorities(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v8.db")
	db, err := OpenDB(path, DBOptions{})
	require.NoError(t, err)
	require.NoError(t, migrate.SQLite(context.Background(), db, "outbox_schema", outboxMigrations[:8], "", ErrSchemaTooNew))
	// What a schema 8 relay leaves: 1..3 sent (3 marked last), 4 dead, 5
	// and 6 pending, limits set.
	_, err = db.Exec(`
		UPDATE outbox_state SET max_pending_count = 100, max_pending_bytes = 1000;
		INSERT INTO outbox (seq, id, topic, payload) VALUES
			(1, 'id-1', 't', 'p1'), (2, 'id-2', 't', 'p2'), (3, 'id-3', 't', 'p3'),
			(4, 'id-4', 't', 'p4'), (5, 'id-5', 't', 'p5'), (6, 'id-6', 't', 'p6');
		UPDATE outbox SET dead_at = 1500, attempts = 3 WHERE seq = 4;
		UPDATE outbox_state SET sent_seq = 2, sent_at = 1000;
		UPDATE outbox_state SET sent_seq = 3, sent_at = 2000;`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	ob := openTestPath(t, path, Options{MaxPendingMessages: 100, MaxPendingBytes: 1000})
	require.Equal(t, []migratedRow{
		{1, "id-1", "p1", "sent", 0},
		{2, "id-2", "p2", "sent", 0},
		{3, "id-3", "p3", "sent", 0},
		{4, "id-4", "p4", "dead", 3},
		{5, "id-5", "p5", "pending", 0},
		{6, "id-6", "p6", "pending", 0},
	}, migratedRows(t, ob))
	ctx := context.Background()
	sent, err := ob.List(ctx, ListOptions{State: StateSent})
	require.NoError(t, err)
	require.Len(t, sent, 3)
	require.EqualValues(t, 1000, sent[0].SentAt.UnixMilli(), "sent_at from the old log")
	require.EqualValues(t, 2000, sent[2].SentAt.UnixMilli())
	var marks, floor, priorities int64
	require.NoError(t, ob.DB().QueryRow(`SELECT sent_seq_0 + sent_seq_1 + sent_seq_2 + sent_seq_3 + sent_seq_4
		+ sent_seq_5 + sent_seq_6 + sent_seq_7 + sent_seq_8 + sent_seq_9, seq_floor,
		(SELECT count(*) FROM outbox WHERE priority <> 0) FROM outbox_state`).Scan(&marks, &floor, &priorities))
	require.EqualValues(t, 30, marks, "every priority's mark at the common one")
	require.EqualValues(t, 3, floor, "seq_floor at least the mark")
	require.Zero(t, priorities)
	st, err := ob.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Pending)
	require.EqualValues(t, 4, st.PendingBytes)
	require.EqualValues(t, 3, st.Sent)
	checkCounters(t, ob.DB())
	_, err = ob.DB().Exec(`DELETE FROM outbox WHERE seq = 2; INSERT INTO outbox (seq, topic, payload, priority) VALUES (2, 't', 'late', 9)`)
	require.NoError(t, err)
	var seq int64
	require.NoError(t, ob.DB().QueryRow(`SELECT seq FROM outbox WHERE payload = 'late'`).Scan(&seq))
	require.EqualValues(t, 7, seq, "a writer's seq at or below a mark is moved above every row")
	checkCounters(t, ob.DB())
}
