package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeoutbox/outbox/internal/sqlconn"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"
)

func TestEnqueueValidation(t *testing.T) {
	ob := openTest(t, Options{MaxPayloadBytes: 1024})
	ctx := context.Background()
	cases := []struct {
		name string
		msg  Message
		want error
	}{
		{"empty topic", Message{Topic: ""}, ErrTopicEmpty},
		{"plus wildcard", Message{Topic: "a/+/b"}, ErrTopicWildcard},
		{"hash wildcard", Message{Topic: "a/#"}, ErrTopicWildcard},
		{"NUL", Message{Topic: "a\x00b"}, ErrTopicNUL},
		{"invalid UTF-8", Message{Topic: "a\xffb"}, ErrTopicNotUTF8},
		{"too long", Message{Topic: strings.Repeat("a", 65536)}, ErrTopicTooLong},
		{"control character", Message{Topic: "a/\u0085"}, ErrTopicControl},
		{"noncharacter", Message{Topic: "a/\ufffe"}, ErrTopicControl},
		{"reserved for the broker", Message{Topic: "$SYS/x"}, ErrTopicReserved},
		{"payload over limit", Message{Topic: "t", Payload: make([]byte, 1025)}, ErrPayloadTooLarge},
		{"bad id", Message{Topic: "t", ID: strings.Repeat("x", 200)}, ErrInvalidMessage},
		{"bad type", Message{Topic: "t", Type: "\xff"}, ErrInvalidMessage},
		{"negative expiry", Message{Topic: "t", Expiry: -time.Second}, ErrInvalidMessage},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tx, err := ob.DB().Begin()
			require.NoError(t, err)
			defer tx.Rollback()
			// A valid message first: nothing of the batch may be written.
			err = ob.Enqueue(ctx, tx, Message{Topic: "ok"}, c.msg)
			require.ErrorIs(t, err, c.want)
			if errors.Is(c.want, ErrInvalidTopic) {
				require.ErrorIs(t, err, ErrInvalidTopic)
			}
			var n int
			require.NoError(t, tx.QueryRow(`SELECT count(*) FROM outbox`).Scan(&n))
			require.Zero(t, n, "nothing written before validation failed")
		})
	}
	t.Run("exactly at limits", func(t *testing.T) {
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, Message{Topic: strings.Repeat("a", 65535), Payload: make([]byte, 1024)})
		})
		require.NoError(t, err)
	})
	t.Run("nil tx", func(t *testing.T) {
		require.ErrorIs(t, ob.Enqueue(ctx, nil, Message{Topic: "t"}), ErrNilTx)
	})
	t.Run("finished tx", func(t *testing.T) {
		tx, err := ob.DB().Begin()
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		require.ErrorIs(t, ob.Enqueue(ctx, tx, Message{Topic: "t"}), sql.ErrTxDone)
	})
}

func TestValidateTopicAgreesWithSchema(t *testing.T) {
	// The CHECK constraint guards plain-SQL writers; it must refuse what
	// ValidateTopic refuses for empty, wildcard and NUL topics.
	ob := openTest(t, Options{})
	for _, topic := range []string{"", "a/+", "#", "a\x00"} {
		_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES (?, 'x')`, topic)
		require.Error(t, err, "topic %q", topic)
		require.Error(t, ValidateTopic(topic))
	}
}

func TestClosed(t *testing.T) {
	ob := openTest(t, Options{})
	tx, err := ob.DB().Begin()
	require.NoError(t, err)
	defer tx.Rollback()
	require.NoError(t, ob.Close())
	require.NoError(t, ob.Close(), "Close is idempotent")
	require.ErrorIs(t, ob.Enqueue(context.Background(), tx, Message{Topic: "t"}), ErrClosed)
	require.ErrorIs(t, ob.Transact(context.Background(), func(*sql.Tx) error { return nil }), ErrClosed)
	r, err := ob.NewRelay(&fakePublisher{}, fastRelay())
	require.NoError(t, err)
	require.ErrorIs(t, r.Run(context.Background()), ErrClosed)
}

func TestRollbackWritesNothing(t *testing.T) {
	ob := openTest(t, Options{})
	ctx := context.Background()
	boom := errors.New("business rule failed")
	err := ob.Transact(ctx, func(tx *sql.Tx) error {
		if _, err := tx.Exec(`INSERT INTO orders (item) VALUES ('x')`); err != nil {
			return err
		}
		if err := ob.Enqueue(ctx, tx, Message{Topic: "orders"}); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, 0, countState(t, ob, "pending"))
	st, err := ob.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Pending)
}

func TestEnqueueBatchAndDefaults(t *testing.T) {
	ob := openTest(t, Options{})
	ctx := context.Background()
	msgs := make([]Message, 150) // more than one INSERT chunk
	for i := range msgs {
		msgs[i] = Message{Topic: "t", Payload: []byte{byte(i)}}
	}
	msgs[3].ID = "my-id"
	msgs[4].Payload = nil
	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }))
	recs, err := ob.List(ctx, ListOptions{Limit: 1000, WithPayload: true})
	require.NoError(t, err)
	require.Len(t, recs, 150)
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	for i, r := range recs {
		if i > 0 {
			require.Greater(t, r.Seq, recs[i-1].Seq)
		}
		if i == 3 {
			require.Equal(t, "my-id", r.ID)
		} else {
			require.Regexp(t, uuid, r.ID)
		}
		if i == 4 {
			require.Equal(t, 0, r.Size)
		} else {
			require.Equal(t, []byte{byte(i)}, r.Payload)
		}
	}
	st, err := ob.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 150, st.Pending)
	require.EqualValues(t, 149, st.PendingBytes)
	require.False(t, st.OldestPending.IsZero())
	require.Equal(t, SchemaVersion, st.SchemaVersion)

	// A duplicate id is refused by the database; the transaction rolls back.
	err = ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, Message{Topic: "t", ID: "my-id"}) })
	require.Error(t, err)
}

func TestPlainSQLRowsGetDefaults(t *testing.T) {
	ob := openTest(t, Options{})
	_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('a', 'text payload'), ('b', X'00FF')`)
	require.NoError(t, err)
	recs, err := ob.List(context.Background(), ListOptions{WithPayload: true})
	require.NoError(t, err)
	require.Len(t, recs, 2)
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	require.Regexp(t, uuid, recs[0].ID)
	require.Regexp(t, uuid, recs[1].ID)
	require.NotEqual(t, recs[0].ID, recs[1].ID)
	require.InDelta(t, float64(recs[0].CreatedAt.UnixMilli()), float64(ob.now().UnixMilli()), 60_000)
	require.Equal(t, 12, recs[0].Size)
	require.Equal(t, []byte{0, 0xff}, recs[1].Payload)
	st, err := ob.Stats(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Pending)
	require.EqualValues(t, 14, st.PendingBytes)
}

func TestCapacity(t *testing.T) {
	ctx := context.Background()
	t.Run("messages", func(t *testing.T) {
		ob := openTest(t, Options{MaxPendingMessages: 3})
		for i := 0; i < 3; i++ {
			commitOrder(t, ob, "orders", i)
		}
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			if _, err := tx.Exec(`INSERT INTO orders (item) VALUES ('over')`); err != nil {
				return err
			}
			return ob.Enqueue(ctx, tx, Message{Topic: "orders"})
		})
		require.ErrorIs(t, err, ErrFull)
		var orders int
		require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM orders`).Scan(&orders))
		require.Equal(t, 3, orders, "the business row rolled back with the event")
		// Plain-SQL writers are held to the same limit.
		_, err = ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('x', 'y')`)
		require.ErrorContains(t, err, "outbox full")
		// Room comes back when a message leaves the pending state.
		_, err = ob.DB().Exec(`UPDATE outbox_state SET sent_seq = 1`)
		require.NoError(t, err)
		commitOrder(t, ob, "orders", 4)
		require.Equal(t, 3, countState(t, ob, "pending"))
		require.Equal(t, 1, countState(t, ob, "sent"), "nothing committed was dropped")
	})
	t.Run("bytes", func(t *testing.T) {
		ob := openTest(t, Options{MaxPendingBytes: 100})
		require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, Message{Topic: "t", Payload: make([]byte, 60)})
		}))
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, Message{Topic: "t", Payload: make([]byte, 41)})
		})
		require.ErrorIs(t, err, ErrFull)
		require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, Message{Topic: "t", Payload: make([]byte, 40)})
		}))
	})
	t.Run("bytes come back when sent or dead", func(t *testing.T) {
		ob := openTest(t, Options{MaxPendingBytes: 100})
		enqueue := func(topic string, n int) error {
			return ob.Transact(ctx, func(tx *sql.Tx) error {
				return ob.Enqueue(ctx, tx, Message{Topic: topic, Payload: make([]byte, n)})
			})
		}
		require.NoError(t, enqueue("good", 60))
		require.NoError(t, enqueue("bad", 30))
		require.ErrorIs(t, enqueue("good", 11), ErrFull)
		opts := fastRelay()
		opts.Retry = fastRetry(1)
		r, err := ob.NewRelay(&fakePublisher{reject: func(topic string) error {
			if topic == "bad" {
				return fmt.Errorf("%w: no", ErrRejected)
			}
			return nil
		}}, opts)
		require.NoError(t, err)
		stop := startRelay(t, r)
		eventually(t, 5*time.Second, "one sent, one dead", func() bool {
			st, err := ob.Stats(ctx)
			require.NoError(t, err)
			return st.Pending == 0 && st.Dead == 1
		})
		stop()
		var counted int64
		require.NoError(t, ob.DB().QueryRow(`SELECT pending_bytes FROM outbox_state`).Scan(&counted))
		require.Zero(t, counted)
		require.NoError(t, enqueue("good", 100))
		require.ErrorIs(t, enqueue("good", 1), ErrFull)
	})
	t.Run("byte limit set on a backlog", func(t *testing.T) {
		ob := openTest(t, Options{})
		require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, Message{Topic: "t", Payload: make([]byte, 50)})
		}))
		ob2, err := New(ctx, ob.DB(), Options{MaxPendingBytes: 60})
		require.NoError(t, err)
		err = ob2.Transact(ctx, func(tx *sql.Tx) error { return ob2.Enqueue(ctx, tx, Message{Topic: "t", Payload: make([]byte, 11)}) })
		require.ErrorIs(t, err, ErrFull, "what was pending before the limit counts")
		require.NoError(t, ob2.Transact(ctx, func(tx *sql.Tx) error {
			return ob2.Enqueue(ctx, tx, Message{Topic: "t", Payload: make([]byte, 10)})
		}))
	})
	t.Run("limit stored and removable", func(t *testing.T) {
		ob := openTest(t, Options{MaxPendingMessages: 1})
		commitOrder(t, ob, "t", 1)
		// A second Outbox on the same database without limits keeps them.
		ob2, err := New(ctx, ob.DB(), Options{})
		require.NoError(t, err)
		err = ob2.Transact(ctx, func(tx *sql.Tx) error { return ob2.Enqueue(ctx, tx, Message{Topic: "t"}) })
		require.ErrorIs(t, err, ErrFull)
		_, err = New(ctx, ob.DB(), Options{MaxPendingMessages: -1})
		require.NoError(t, err)
		commitOrder(t, ob, "t", 2)
	})
}

func TestSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	ob, err := Open(ctx, path, Options{Logger: testLogger()})
	require.NoError(t, err)
	require.NoError(t, ob.Close())

	t.Run("a new file is created at the newest schema, nothing left free", func(t *testing.T) {
		ob, err := Open(ctx, path, Options{Logger: testLogger()})
		require.NoError(t, err)
		defer ob.Close()
		var free int
		require.NoError(t, ob.DB().QueryRow(`PRAGMA freelist_count`).Scan(&free))
		require.Zero(t, free)
		var v1Tables int
		require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name IN ('outbox_counters', 'outbox_pending')`).Scan(&v1Tables))
		require.Zero(t, v1Tables)
	})
	t.Run("migrations are idempotent", func(t *testing.T) {
		for i := 0; i < 2; i++ {
			ob, err := Open(ctx, path, Options{Logger: testLogger()})
			require.NoError(t, err)
			v, err := readSchemaVersion(ctx, ob.DB())
			require.NoError(t, err)
			require.Equal(t, SchemaVersion, v)
			// A new file gets the newest schema in one step: one row.
			var rows int
			require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox_schema`).Scan(&rows))
			require.Equal(t, 1, rows)
			require.NoError(t, ob.Close())
		}
	})
	t.Run("newer schema refused", func(t *testing.T) {
		db, err := OpenDB(path, DBOptions{})
		require.NoError(t, err)
		defer db.Close()
		_, err = db.Exec(`INSERT INTO outbox_schema (version) VALUES (?)`, SchemaVersion+1)
		require.NoError(t, err)
		_, err = New(ctx, db, Options{})
		require.ErrorIs(t, err, ErrSchemaTooNew)
		var v int
		require.NoError(t, db.QueryRow(`SELECT max(version) FROM outbox_schema`).Scan(&v))
		require.Equal(t, SchemaVersion+1, v, "never downgraded")
	})
	t.Run("pending rows read as a range", func(t *testing.T) {
		// The relay's read must seek to the first pending row, not scan
		// what was sent before it.
		ob := openTest(t, Options{})
		rows, err := ob.DB().Query(`EXPLAIN QUERY PLAN SELECT seq, id, topic, payload, type, content_type, created_at, attempts
			FROM outbox WHERE seq > max(?, (SELECT sent_seq FROM outbox_state WHERE id = 1)) AND dead_at IS NULL
			ORDER BY seq LIMIT ?`, 0, 10)
		require.NoError(t, err)
		defer rows.Close()
		var plan strings.Builder
		for rows.Next() {
			var id, parent, unused int
			var detail string
			require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
			plan.WriteString(detail + "\n")
		}
		require.Contains(t, plan.String(), "SEARCH outbox USING INTEGER PRIMARY KEY (rowid>?)")
	})
}

func TestCallerDB(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	t.Run("not WAL", func(t *testing.T) {
		db, err := sql.Open("sqlite", filepath.Join(dir, "rollback.db"))
		require.NoError(t, err)
		defer db.Close()
		_, err = New(ctx, db, Options{})
		require.ErrorIs(t, err, ErrUnsupportedDB)
		require.ErrorContains(t, err, "WAL")
	})
	t.Run("read only", func(t *testing.T) {
		path := filepath.Join(dir, "ro.db")
		db, err := OpenDB(path, DBOptions{})
		require.NoError(t, err)
		db.Close()
		ro, err := sql.Open("sqlite", "file:"+path+"?_pragma=query_only(1)")
		require.NoError(t, err)
		defer ro.Close()
		_, err = New(ctx, ro, Options{})
		require.ErrorIs(t, err, ErrUnsupportedDB)
	})
	t.Run("one connection", func(t *testing.T) {
		db, err := OpenDB(filepath.Join(dir, "one.db"), DBOptions{})
		require.NoError(t, err)
		defer db.Close()
		db.SetMaxOpenConns(1)
		_, err = New(ctx, db, Options{})
		require.ErrorIs(t, err, ErrUnsupportedDB)
	})
	t.Run("own WAL db works", func(t *testing.T) {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "own.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
		require.NoError(t, err)
		defer db.Close()
		ob, err := New(ctx, db, Options{})
		require.NoError(t, err)
		commitOrderNoTable(t, ob)
		require.NoError(t, ob.Close())
		require.NoError(t, db.Ping(), "Close leaves a caller's database open")
	})
	t.Run("not a database", func(t *testing.T) {
		path := filepath.Join(dir, "junk.db")
		require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("not sqlite ", 1000)), 0o600))
		_, err := Open(ctx, path, Options{})
		require.Error(t, err)
	})
	t.Run("odd path", func(t *testing.T) {
		path := filepath.Join(dir, "we?ird #name%.db")
		ob, err := Open(ctx, path, Options{})
		require.NoError(t, err)
		defer ob.Close()
		_, err = os.Stat(path)
		require.NoError(t, err, "the file is created under its literal name")
	})
}

func commitOrderNoTable(t *testing.T, ob *Outbox) {
	require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
		return ob.Enqueue(context.Background(), tx, Message{Topic: "t"})
	}))
}

func TestFilesArePrivate(t *testing.T) {
	ob := openTest(t, Options{})
	commitOrder(t, ob, "t", 1)
	path := dbPath(t, ob)
	fi, err := os.Stat(path + "-reserve")
	require.NoError(t, err)
	require.EqualValues(t, DefaultReserveBytes, fi.Size(), "the disk reserve is written, not sparse-sized")
	for _, p := range []string{path, path + "-wal", path + "-shm", path + "-reserve"} {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), p)
	}
}

func dbPath(t testing.TB, ob *Outbox) string {
	var seq int
	var name, file string
	require.NoError(t, ob.DB().QueryRow(`PRAGMA database_list`).Scan(&seq, &name, &file))
	return file
}

func TestTransactRetriesBusy(t *testing.T) {
	ob := openTest(t, Options{})
	ctx := context.Background()
	calls := 0
	err := ob.Transact(ctx, func(tx *sql.Tx) error {
		calls++
		if calls < 3 {
			// What SQLite returns when a deferred transaction cannot
			// upgrade; Transact must retry it.
			return busyErr(t, ob)
		}
		return ob.Enqueue(ctx, tx, Message{Topic: "t"})
	})
	require.NoError(t, err)
	require.Equal(t, 3, calls)
	require.Equal(t, 1, countState(t, ob, "pending"))
}

// busyErr produces a real SQLITE_BUSY error from the driver.
func busyErr(t *testing.T, ob *Outbox) error {
	db, err := sql.Open("sqlite", "file:"+dbPath(t, ob)+"?_pragma=busy_timeout(0)")
	require.NoError(t, err)
	defer db.Close()
	// The Transact in progress holds the write lock (BEGIN IMMEDIATE).
	_, err = db.Exec(`INSERT INTO orders (item) VALUES ('blocked')`)
	require.True(t, sqlconn.IsBusy(err), "want SQLITE_BUSY, got %v", err)
	return err
}

func TestDiskFull(t *testing.T) {
	// A file system that fills up is simulated with max_page_count, which
	// makes SQLite report SQLITE_FULL exactly as a full disk does.
	ob := openTest(t, Options{})
	ctx := context.Background()
	commitOrder(t, ob, "t", 1)
	conn, err := ob.DB().Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	var pages int
	require.NoError(t, conn.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages))
	_, err = conn.ExecContext(ctx, `PRAGMA max_page_count = `+strconv.Itoa(pages+2))
	require.NoError(t, err)
	tx, err := conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.Exec(`INSERT INTO orders (item) VALUES ('big order')`)
	require.NoError(t, err)
	err = ob.Enqueue(ctx, tx, Message{Topic: "t", Payload: make([]byte, 200_000)})
	require.ErrorIs(t, err, ErrDiskFull)
	require.NoError(t, tx.Rollback())

	var check string
	require.NoError(t, conn.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&check))
	require.Equal(t, "ok", check)
	require.Equal(t, 1, countState(t, ob, "pending"), "what was committed is intact")
	// Space is back (here: the limit is lifted): writes resume.
	_, err = conn.ExecContext(ctx, `PRAGMA max_page_count = 1073741823`)
	require.NoError(t, err)
	tx, err = conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(ctx, tx, Message{Topic: "t", Payload: make([]byte, 200_000)}))
	require.NoError(t, tx.Commit())
	require.Equal(t, 2, countState(t, ob, "pending"))
}

func TestEnqueueRefusesOtherDatabase(t *testing.T) {
	a, b := openTest(t, Options{}), openTest(t, Options{})
	tx, err := b.DB().Begin()
	require.NoError(t, err)
	defer tx.Rollback()
	require.Error(t, a.Enqueue(context.Background(), tx, Message{Topic: "t"}))
}

func TestMustExist(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.db")
	_, err := Open(ctx, missing, Options{MustExist: true})
	require.ErrorIs(t, err, os.ErrNotExist)
	_, statErr := os.Stat(missing)
	require.ErrorIs(t, statErr, os.ErrNotExist, "nothing created")

	junk := filepath.Join(dir, "junk.db")
	require.NoError(t, os.WriteFile(junk, []byte(strings.Repeat("junk", 2000)), 0o600))
	_, err = Open(ctx, junk, Options{MustExist: true})
	require.ErrorContains(t, err, "not a SQLite database")

	plain := filepath.Join(dir, "plain.db")
	db, err := sql.Open("sqlite", plain)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE t (x)`)
	require.NoError(t, err)
	db.Close()
	_, err = Open(ctx, plain, Options{MustExist: true})
	require.ErrorIs(t, err, ErrNoSchema)
	db, err = sql.Open("sqlite", plain)
	require.NoError(t, err)
	var mode string
	require.NoError(t, db.QueryRow(`PRAGMA journal_mode`).Scan(&mode))
	db.Close()
	require.Equal(t, "delete", mode, "a refused file is left as it was")

	good := filepath.Join(dir, "good.db")
	ob, err := Open(ctx, good, Options{})
	require.NoError(t, err)
	require.NoError(t, ob.Close())
	ob, err = Open(ctx, good, Options{MustExist: true})
	require.NoError(t, err)
	require.NoError(t, ob.Close())
}

// TestOpenSaysWhatIsWrong: Open names the path once and says what is wrong
// with it: the directory missing (it said "no such file or directory", after
// the path twice), a directory (it said "unable to open database file
// (14)"), a table named outbox that is not an outbox's (it said "SQL logic
// error: table outbox already exists", and with MustExist "no outbox
// schema", whose remedy, creating one, fails). Nothing is created.
func TestOpenSaysWhatIsWrong(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	foreign := filepath.Join(dir, "foreign.db")
	db, err := sql.Open("sqlite", foreign)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE outbox (id INTEGER PRIMARY KEY, body TEXT)`)
	require.NoError(t, err)
	db.Close()
	for _, c := range []struct {
		path, want string
		is         error
	}{
		{filepath.Join(dir, "nonexistent", "x.db"), "the directory " + filepath.Join(dir, "nonexistent") + " does not exist: create it first", os.ErrNotExist},
		{dir, "is a directory, not a database file: give the path of a file, e.g. " + filepath.Join(dir, "outbox.db"), syscall.EISDIR},
		{foreign, "this database has a table named outbox that is not an outbox's (no outbox_schema table): use another file, or rename that table", ErrForeignTable},
	} {
		for _, opts := range []Options{{}, {MustExist: true}, {ReadOnly: true}} {
			_, err := Open(ctx, c.path, opts)
			require.ErrorIs(t, err, c.is, "%s %+v", c.path, opts)
			require.ErrorContains(t, err, c.want, "%s %+v", c.path, opts)
			for _, op := range []string{": open ", ": stat "} {
				require.NotContains(t, err.Error(), c.path+op+c.path, "the path once")
			}
		}
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "nothing created beside foreign.db")
	db, err = sql.Open("sqlite", foreign)
	require.NoError(t, err)
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM sqlite_schema`).Scan(&n))
	db.Close()
	require.Equal(t, 1, n, "the foreign file is left as it was")
	db, err = OpenDB(foreign, DBOptions{})
	require.NoError(t, err)
	defer db.Close()
	_, err = New(ctx, db, Options{})
	require.ErrorIs(t, err, ErrForeignTable, "New on the caller's database too")
}

// TestWritersRacingClose: a Transact or Enqueue that races Close either
// does its work or fails with ErrClosed. A Transact that Close overtook
// after its own check used to fail with database/sql's "sql: database is
// closed" (18 of 400 writers racing Close in a loop did, on the code before
// this test).
func TestWritersRacingClose(t *testing.T) {
	ctx := context.Background()
	t.Run("Close between the check and BEGIN", func(t *testing.T) {
		ob, err := Open(ctx, filepath.Join(t.TempDir(), "race.db"), Options{Logger: testLogger()})
		require.NoError(t, err)
		ob.hooks.beforeTx = func() { require.NoError(t, ob.Close()) }
		err = ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, Message{Topic: "t"}) })
		require.ErrorIs(t, err, ErrClosed)
	})
	t.Run("Enqueue in a transaction that Close overtakes", func(t *testing.T) {
		db, err := OpenDB(filepath.Join(t.TempDir(), "race.db"), DBOptions{})
		require.NoError(t, err)
		defer db.Close()
		for round := 0; round < 100; round++ {
			ob, err := New(ctx, db, Options{Logger: testLogger()})
			require.NoError(t, err)
			tx, err := db.Begin()
			require.NoError(t, err)
			started := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				var err error
				for i := 0; err == nil; i++ {
					if i == 1 {
						close(started)
					}
					err = ob.Enqueue(ctx, tx, Message{Topic: "t"}, Message{Topic: "t"})
				}
				done <- err
			}()
			<-started
			require.NoError(t, ob.Close())
			require.ErrorIs(t, <-done, ErrClosed, "round %d", round)
			require.NoError(t, tx.Rollback())
		}
	})
}

// TestFullRecognisedExactly: only the capacity trigger's own error is
// ErrFull; an error of the application's whose text says "outbox full" used
// to be reported as ErrFull too.
func TestFullRecognisedExactly(t *testing.T) {
	ctx := context.Background()
	require.NotErrorIs(t, classifyWriteErr(errors.New("outbox full: pending limit reached")), ErrFull)
	ob := openTest(t, Options{MaxPendingMessages: 1})
	_, err := ob.DB().Exec(`CREATE TRIGGER app_check AFTER INSERT ON outbox WHEN NEW.topic = 'junk'
		BEGIN SELECT RAISE(ABORT, 'app: outbox full of junk'); END`)
	require.NoError(t, err)
	err = enqueueTopic(ctx, ob, "junk", nil)
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrFull)
	require.ErrorContains(t, err, "app: outbox full of junk")
	require.NoError(t, enqueueTopic(ctx, ob, "t", nil))
	err = enqueueTopic(ctx, ob, "t", nil)
	require.ErrorIs(t, err, ErrFull, "the limit's own error")
	_, err = ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('t', '')`)
	require.ErrorIs(t, classifyWriteErr(err), ErrFull)
}
