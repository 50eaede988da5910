package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/edgeoutbox/outbox/internal/migrate"
	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// The hot paths, one by one (outboxlab bench measures them together, end to
// end, against the machine's limits):
//
//	go test -run '^$' -bench . -benchmem
//
// ns/msg is the time per message where an operation handles several.

func benchPayload(n int) []byte {
	b := fmt.Appendf(nil, `{"n":%d,"order":"ord-%08d","store":42,"pad":"`, n, n)
	for len(b) < 198 {
		b = append(b, 'x')
	}
	return append(b, '"', '}')
}

// BenchmarkEnqueue is Enqueue alone: one 200-byte message written inside an
// open transaction (committed every 1,000 operations, off the clock).
func BenchmarkEnqueue(b *testing.B) { benchEnqueueInTx(b, 1) }

// BenchmarkEnqueue10 is one Enqueue of ten messages.
func BenchmarkEnqueue10(b *testing.B) { benchEnqueueInTx(b, 10) }

func benchEnqueueInTx(b *testing.B, k int) {
	ob := openTest(b, Options{Synchronous: SyncNormal, ReserveBytes: -1})
	ctx := context.Background()
	msgs := make([]Message, k)
	for i := range msgs {
		msgs[i] = Message{Topic: "pos/1/orders", Type: "com.example.order.created", Payload: benchPayload(i)}
	}
	tx, err := ob.DB().BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { tx.Commit() }()
	ops := 0
	b.ReportAllocs()
	for b.Loop() {
		if ops > 0 && ops%1000 == 0 {
			b.StopTimer()
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
			if tx, err = ob.DB().BeginTx(ctx, nil); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if err := ob.Enqueue(ctx, tx, msgs...); err != nil {
			b.Fatal(err)
		}
		ops++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(ops*k), "ns/msg")
}

func BenchmarkNewID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = NewID()
	}
}

// BenchmarkEncode* build the bytes the relay publishes for one 200-byte
// payload: CloudEvents with JSON data inline, CloudEvents with binary data
// (base64), and raw.
func BenchmarkEncodeCloudEvents200(b *testing.B) {
	benchEncode(b, encoder{source: "/outbox/device", defaultType: DefaultEventType}, benchPayload(12345))
}

// BenchmarkEncodeBinaryMode200 is CloudEvents binary mode (MQTT 5): the
// payload copied, the attributes as user properties.
func BenchmarkEncodeBinaryMode200(b *testing.B) {
	enc := encoder{source: "/outbox/device", defaultType: DefaultEventType, mode: EnvelopeCloudEventsBinary}
	m := &row{outgoing: outgoing{seq: 123456, id: NewID(), topic: "pos/1/orders", typ: "com.example.order.created", payload: benchPayload(12345), createdAt: 1700000000000}}
	b.ReportAllocs()
	for b.Loop() {
		enc.encodeRow(m, true)
		if m.encErr != nil {
			b.Fatal(m.encErr)
		}
	}
}

func BenchmarkEncodeCloudEventsBinary(b *testing.B) {
	p := make([]byte, 200)
	for i := range p {
		p[i] = byte(i * 7)
	}
	benchEncode(b, encoder{source: "/outbox/device", defaultType: DefaultEventType}, p)
}

func BenchmarkEncodeRaw(b *testing.B) {
	benchEncode(b, encoder{mode: EnvelopeRaw}, benchPayload(12345))
}

func benchEncode(b *testing.B, enc encoder, payload []byte) {
	m := &outgoing{seq: 123456, id: NewID(), topic: "pos/1/orders", typ: "com.example.order.created", payload: payload, createdAt: 1700000000000}
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := enc.encode(buf[:0], m); err != nil {
			b.Fatal(err)
		}
	}
}

// backlogOutbox returns an outbox with n pending 200-byte messages.
func backlogOutbox(b *testing.B, n int, priorities ...int) *Outbox {
	b.Helper()
	ob := openTest(b, Options{Synchronous: SyncNormal, ReserveBytes: -1})
	ctx := context.Background()
	for i := 0; i < n; {
		var msgs []Message
		for ; i < n && len(msgs) < 5000; i++ {
			m := Message{Topic: "pos/1/orders", Payload: benchPayload(i)}
			if len(priorities) > 0 {
				m.Priority = priorities[i%len(priorities)]
			}
			msgs = append(msgs, m)
		}
		if err := ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }); err != nil {
			b.Fatal(err)
		}
	}
	return ob
}

// relayConnFor returns a relay and a connection of its own, as Run has.
func relayConnFor(b *testing.B, ob *Outbox) (*Relay, *sqlconn.Conn) {
	b.Helper()
	r, err := ob.NewRelay(&fakePublisher{}, RelayOptions{Source: "/outbox/device"})
	if err != nil {
		b.Fatal(err)
	}
	c, err := sqlconn.Open(context.Background(), ob.DB())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	holdLease(b, r, c)
	return r, c
}

// BenchmarkFetchBatch is the batch claim: the relay's read of the next 256
// pending rows, each encoded as a CloudEvent.
func BenchmarkFetchBatch(b *testing.B) {
	ob := backlogOutbox(b, 10_000)
	r, rc := relayConnFor(b, ob)
	ctx := context.Background()
	var cursor int64
	msgs := 0
	b.ReportAllocs()
	for b.Loop() {
		_, rows, _, err := r.fetch(ctx, rc, 0, cursor, r.opts.ReadSize, false)
		if err != nil {
			b.Fatal(err)
		}
		if len(rows) == 0 {
			cursor = 0
			continue
		}
		cursor = rows[len(rows)-1].seq
		msgs += len(rows)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(msgs, 1)), "ns/msg")
}

// BenchmarkFetchPriorities is the relay's reads of a 10,000-row backlog,
// lane after lane, with a commit by another connection between reads as
// the marks make (it empties the reader's page cache): all at priority 0,
// and spread over 0, 5 and 9 in turn. A priority's rows spread over three
// times the pages, read once per lane: the floor of what a spread backlog
// costs the relay beyond one priority.
func BenchmarkFetchPriorities(b *testing.B) {
	b.Run("p0", func(b *testing.B) { benchFetchPriorities(b, 0) })
	b.Run("spread", func(b *testing.B) { benchFetchPriorities(b, 0, 5, 9) })
}

func benchFetchPriorities(b *testing.B, priorities ...int) {
	const n = 10_000
	ob := backlogOutbox(b, n, priorities...)
	r, rc := relayConnFor(b, ob)
	ctx := context.Background()
	msgs := 0
	for b.Loop() {
		for _, p := range slices.Backward(slices.Sorted(slices.Values(priorities))) {
			cursor := int64(0)
			for {
				_, rows, more, err := r.fetch(ctx, rc, p, cursor, r.opts.ReadSize, false)
				if err != nil {
					b.Fatal(err)
				}
				msgs += len(rows)
				if _, err := ob.DB().Exec(`UPDATE outbox_state SET sent_at = ? WHERE id = 1`, msgs); err != nil {
					b.Fatal(err)
				}
				if !more {
					break
				}
				cursor = rows[len(rows)-1].seq
			}
		}
	}
	if msgs != b.N*n {
		b.Fatalf("read %d rows, want %d", msgs, b.N*n)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(msgs), "ns/msg")
}

// BenchmarkMarkSent64 and BenchmarkMarkSent512 mark acknowledged messages
// sent, 64 and 512 per mark (the marks batch up to 512).
func BenchmarkMarkSent64(b *testing.B)  { benchMarkSent(b, 64) }
func BenchmarkMarkSent512(b *testing.B) { benchMarkSent(b, 512) }

func benchMarkSent(b *testing.B, batch int) {
	const n = 20_480
	ob := backlogOutbox(b, n)
	r, rc := relayConnFor(b, ob)
	next := int64(1)
	marked := 0
	acked := make([]mark, batch)
	b.ReportAllocs()
	for b.Loop() {
		if next+int64(batch) > n+1 {
			b.StopTimer()
			if _, err := ob.DB().Exec(`UPDATE outbox_state SET sent_seq = 0, sent_seq_0 = 0`); err != nil {
				b.Fatal(err)
			}
			next = 1
			b.StartTimer()
		}
		for i := range acked {
			acked[i] = mark{seq: next + int64(i)}
		}
		next += int64(batch)
		if err := r.markSent(rc, acked); err != nil {
			b.Fatal(err)
		}
		marked += batch
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(marked, 1)), "ns/msg")
}

// BenchmarkRelayDrain is the whole relay — fetch, encode, publish, mark —
// against a publisher that acknowledges at once: the relay's own ceiling,
// without a network or a broker. One operation drains 10,000 messages.
// durable is the relay as it is; nosync is the same without the fsync of
// the WAL before publishing (durable.go), which the public API cannot turn
// off: the cost of durable before publish is the difference.
func BenchmarkRelayDrain(b *testing.B) {
	b.Run("durable", func(b *testing.B) { benchRelayDrain(b, true) })
	b.Run("nosync", func(b *testing.B) { benchRelayDrain(b, false) })
}

// BenchmarkRelayDrainPriorities is BenchmarkRelayDrain's nosync case with
// the backlog at priority 0, at 9, and spread over 0, 5 and 9 in turn.
func BenchmarkRelayDrainPriorities(b *testing.B) {
	b.Run("p0", func(b *testing.B) { benchRelayDrain(b, false, 0) })
	b.Run("p9", func(b *testing.B) { benchRelayDrain(b, false, 9) })
	b.Run("spread", func(b *testing.B) { benchRelayDrain(b, false, 0, 5, 9) })
}

func benchRelayDrain(b *testing.B, durable bool, priorities ...int) {
	const n = 10_000
	total := time.Duration(0)
	var syncs int64
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		ob := backlogOutbox(b, n, priorities...)
		pub := &fakePublisher{}
		r, err := ob.NewRelay(pub, fastRelay())
		if err != nil {
			b.Fatal(err)
		}
		if !durable {
			r.hooks.syncWAL = func() error { return nil }
		}
		b.StartTimer()
		start, cpu0 := time.Now(), processCPU(b)
		stop := startRelay(b, r)
		for r.sent.Load() < n {
			time.Sleep(time.Millisecond)
		}
		total += time.Since(start)
		cpu += processCPU(b) - cpu0
		b.StopTimer()
		stop()
		syncs += r.wal.Syncs.Load()
		ob.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N*n), "ns/msg")
	// CPU time (user + system, every goroutine): a figure that a loaded
	// machine disturbs less than the time taken.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*n), "cpu-ns/msg")
	// Durable before publish: one fsync of the WAL per batch read.
	b.ReportMetric(float64(syncs)*1000/float64(b.N*n), "fsyncs/1000msg")
}

// processCPU is the user and system CPU time this process used so far.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStats100k and BenchmarkGet100k read a backlog of 100,000
// pending messages: Stats counts the pending rows (no counter is kept per
// message) and Get looks an id up without an index.
func BenchmarkStats100k(b *testing.B) {
	ob := backlogOutbox(b, 100_000)
	ctx := context.Background()
	for b.Loop() {
		st, err := ob.Stats(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if st.Pending != 100_000 {
			b.Fatalf("pending %d", st.Pending)
		}
	}
}

func BenchmarkGet100k(b *testing.B) {
	ob := backlogOutbox(b, 100_000)
	ctx := context.Background()
	var id string
	// The oldest: Get reads from the newest row back, so this is the worst case.
	if err := ob.DB().QueryRow(`SELECT id FROM outbox ORDER BY seq LIMIT 1`).Scan(&id); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := ob.Get(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDiskPerPendingEvent reports the database space a pending event
// takes: 20,000 events of 200 bytes, one per transaction, as pages in use
// (FLEET.md's sizing).
func BenchmarkDiskPerPendingEvent(b *testing.B) {
	const n = 20_000
	ctx := context.Background()
	payload := bytes.Repeat([]byte("x"), 200)
	inUse := func(ob *Outbox) int64 {
		var pages, free, size int64
		if err := ob.DB().QueryRow(`SELECT (SELECT page_count FROM pragma_page_count()),
			(SELECT freelist_count FROM pragma_freelist_count()), (SELECT page_size FROM pragma_page_size())`).Scan(&pages, &free, &size); err != nil {
			b.Fatal(err)
		}
		return (pages - free) * size
	}
	var per float64
	for b.Loop() {
		b.StopTimer()
		ob := openTest(b, Options{Synchronous: SyncNormal, ReserveBytes: -1})
		before := inUse(ob)
		b.StartTimer()
		for i := 0; i < n; i++ {
			if err := ob.Transact(ctx, func(tx *sql.Tx) error {
				return ob.Enqueue(ctx, tx, Message{Topic: "acme/store-0042/sales", Type: "com.example.sale", Payload: payload})
			}); err != nil {
				b.Fatal(err)
			}
		}
		per = float64(inUse(ob)-before) / n
		ob.Close()
	}
	b.ReportMetric(per, "B/event")
}

// BenchmarkInsertPath is the CPU of one outbox row as the library writes
// it, at synchronous=OFF inside transactions of 20,000 rows, next to a bare
// row (seq, topic, payload; no index, no trigger), to the outbox's columns
// alone and with each of the schema's features on them
// (testdata/insert_features.sql), and to the same row on schema 5 with the
// statement Enqueue used then: what the schema and the statement add to a
// row (issue #17).
func BenchmarkInsertPath(b *testing.B) {
	pl := benchPayload(1)
	id := NewID()
	now := time.Now().UnixMilli()
	features, err := os.ReadFile("testdata/insert_features.sql")
	if err != nil {
		b.Fatal(err)
	}
	withFeatures := func(ctx context.Context, db *sql.DB) error {
		if err := migrateOutbox(ctx, db); err != nil {
			return err
		}
		_, err := db.ExecContext(ctx, string(features))
		return err
	}
	featureInsert := func(table string) string {
		return `INSERT INTO ` + table + ` (id, topic, payload, type, created_at) VALUES (?, ?, ?, ?, ?)`
	}
	rowArgs := []any{id, "pos/1/orders", pl, "com.example.order.created", now}
	const schema5Insert = `INSERT INTO outbox (id, topic, payload, type, content_type, created_at, expires_at)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?8 > 0 THEN max(?7, (SELECT clock_ms FROM outbox_state WHERE id = 1)) + ?8 END)`
	for _, v := range []struct {
		name   string
		schema func(ctx context.Context, db *sql.DB) error
		q      string
		args   []any
	}{
		{"bare", func(ctx context.Context, db *sql.DB) error {
			_, err := db.ExecContext(ctx, `CREATE TABLE outbox_bare (seq INTEGER PRIMARY KEY, topic TEXT NOT NULL, payload BLOB NOT NULL)`)
			return err
		}, `INSERT INTO outbox_bare (topic, payload) VALUES (?, ?)`, []any{"pos/1/orders", pl}},
		{"columns", withFeatures, featureInsert("wide"), rowArgs},
		{"columns+check", withFeatures, featureInsert("wide_checked"), rowArgs},
		{"columns+indexes", withFeatures, featureInsert("wide_indexed"), rowArgs},
		{"columns+trigger", withFeatures, featureInsert("wide_triggered"), rowArgs},
		{"schema5", func(ctx context.Context, db *sql.DB) error {
			return migrate.SQLite(ctx, db, "outbox_schema", outboxMigrations[:5], "", ErrSchemaTooNew)
		}, schema5Insert, []any{id, "pos/1/orders", pl, "com.example.order.created", "", now, now, int64(0)}},
		{"schema6", func(ctx context.Context, db *sql.DB) error {
			return migrate.SQLite(ctx, db, "outbox_schema", outboxMigrations[:6], "", ErrSchemaTooNew)
		}, insertSQLs[insertNoContentType], rowArgs},
		{"schema" + fmt.Sprint(SchemaVersion), migrateOutbox, insertSQLs[insertNoContentType], rowArgs},
		// A topic outside printable ASCII takes the second look for what
		// no broker takes (schema 7).
		{"schema" + fmt.Sprint(SchemaVersion) + "+unicode_topic", migrateOutbox, insertSQLs[insertNoContentType],
			[]any{id, "pos/Zürich/orders", pl, "com.example.order.created", now}},
	} {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			db, err := OpenDB(b.TempDir()+"/insert.db", DBOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			db.SetMaxOpenConns(1)
			if err := v.schema(ctx, db); err != nil {
				b.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `PRAGMA synchronous = OFF`); err != nil {
				b.Fatal(err)
			}
			st, err := db.PrepareContext(ctx, v.q)
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			txs := tx.StmtContext(ctx, st)
			n := 0
			for b.Loop() {
				if n > 0 && n%20_000 == 0 {
					b.StopTimer()
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
					if tx, err = db.BeginTx(ctx, nil); err != nil {
						b.Fatal(err)
					}
					txs = tx.StmtContext(ctx, st)
					b.StartTimer()
				}
				if _, err := txs.ExecContext(ctx, v.args...); err != nil {
					b.Fatal(err)
				}
				n++
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkMarkSentMixed is the mark of 64 priority-9 messages of a backlog
// whose every other row is of priority 5, not yet sent: the mark of a
// priority whose range holds another's pending rows, as while a backlog
// spread over priorities drains, highest first ("one"); and with one
// message in 8 of priority 5, its share ("shared").
func BenchmarkMarkSentMixed(b *testing.B) {
	b.Run("one", func(b *testing.B) { benchMarkSentMixed(b, 0) })
	b.Run("shared", func(b *testing.B) { benchMarkSentMixed(b, 8) })
}

func benchMarkSentMixed(b *testing.B, shareEvery int) {
	const n, batch = 20_480, 64
	ob := backlogOutbox(b, n, 5, 9)
	r, rc := relayConnFor(b, ob)
	next9, next5 := int64(2), int64(1)
	marked := 0
	acked := make([]mark, batch)
	for b.Loop() {
		if next9+2*int64(batch) > n+1 {
			b.StopTimer()
			if _, err := ob.DB().Exec(`UPDATE outbox_state SET sent_seq = 0, sent_seq_9 = 0, sent_seq_5 = 0`); err != nil {
				b.Fatal(err)
			}
			next9, next5 = 2, 1
			b.StartTimer()
		}
		for i := range acked {
			if shareEvery > 0 && i%shareEvery == shareEvery-1 {
				acked[i] = mark{seq: next5, priority: 5}
				next5 += 2
				continue
			}
			acked[i] = mark{seq: next9, priority: 9}
			next9 += 2
		}
		slices.SortStableFunc(acked, func(x, y mark) int { return int(x.priority) - int(y.priority) })
		if err := r.markSent(rc, acked); err != nil {
			b.Fatal(err)
		}
		marked += batch
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(marked, 1)), "ns/msg")
}
