package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/migrate"
)

// Input that can never be delivered is refused where it enters — Enqueue,
// and the INSERT of any other writer — and what is already stored is
// parked dead by the relay, with its reason, instead of blocking the queue.

// badTopics are topics no broker takes: control characters (a broker closes
// the connection on them, every time), Unicode noncharacters, and '$'
// topics, which MQTT reserves for brokers.
var badTopics = []string{
	"till/\x01", "till/a\x1fb", "till/\x7f", "till/\u0085", "till/\u009f", "till/\ufdd0", "till/\ufdef",
	"till/\ufffe", "till/\uffff", "till/\U0001fffe", "till/\U0010ffff", "$SYS/x", "$share/g/t",
}

// goodTopics must stay accepted: printable ASCII and Unicode beyond it.
var goodTopics = []string{
	"till/orders", "shops/Zürich/€", "a/日本/b", "x/\u00a0", "x/\u00a0\ufffd", "x/\U0001f600", "x/\ufdcf", "x/\ufdf0",
	"x/\ufffd", "x/\U0001fffd", "a$b", "/leading", "x/~",
}

// TestTopicControlRefused: the topics of badTopics are refused by
// ValidateTopic, Enqueue and a plain-SQL INSERT, and goodTopics accepted by
// all three; the Go check and the schema's agree on every code point up to
// U+0800 and around every noncharacter.
func TestTopicControlRefused(t *testing.T) {
	ob := openTest(t, Options{})
	ctx := context.Background()
	insert := func(topic string) error {
		_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES (?, x'00')`, topic)
		return err
	}
	for _, topic := range badTopics {
		require.ErrorIs(t, ValidateTopic(topic), ErrInvalidTopic, "%q", topic)
		err := ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, Message{Topic: topic}) })
		require.ErrorIs(t, err, ErrInvalidTopic, "Enqueue %q", topic)
		require.ErrorContains(t, insert(topic), "invalid topic", "plain SQL %q", topic)
	}
	for _, topic := range goodTopics {
		require.NoError(t, ValidateTopic(topic), "%q", topic)
		err := ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, Message{Topic: topic}) })
		require.NoError(t, err, "Enqueue %q", topic)
		require.NoError(t, insert(topic), "plain SQL %q", topic)
	}
	// The two checks agree, code point by code point.
	tx, err := ob.DB().Begin()
	require.NoError(t, err)
	defer tx.Rollback()
	var runes []rune
	for r := rune(1); r < 0x800; r++ { // every one- and two-byte character
		runes = append(runes, r)
	}
	for r := rune(0xfdc0); r < 0xfe00; r++ {
		runes = append(runes, r)
	}
	for plane := rune(0); plane <= 0x10; plane++ {
		for r := plane<<16 | 0xfffc; r <= plane<<16|0xffff; r++ {
			runes = append(runes, r)
		}
	}
	st, err := tx.Prepare(`INSERT INTO outbox (topic, payload) VALUES (?, x'00')`)
	require.NoError(t, err)
	defer st.Close()
	for _, r := range runes {
		if r == '+' || r == '#' || r >= 0xd800 && r < 0xe000 {
			continue
		}
		topic := "a/" + string(r) + "/b"
		_, sqlErr := st.Exec(topic)
		require.Equal(t, ValidateTopic(topic) == nil, sqlErr == nil, "U+%04X: Go says %v, SQL says %v", r, ValidateTopic(topic), sqlErr)
	}
	require.ErrorIs(t, ValidateTopic("$"), ErrInvalidTopic)
}

// openV6 returns a database with the outbox schema of version 6, the last
// before the insert refused what can never be delivered.
func openV6(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "v6.db")
	db, err := OpenDB(path, DBOptions{})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, migrate.SQLite(context.Background(), db, "outbox_schema", outboxMigrations[:6], "", ErrSchemaTooNew))
	return path
}

// publishedIDs is the event ids pub received, in order.
func publishedIDs(t *testing.T, pub *fakePublisher) []string {
	t.Helper()
	var ids []string
	for _, ev := range publishedEvents(t, pub) {
		ids = append(ids, ev.ID)
	}
	return ids
}

// TestMigratedBadTopicsParkedDead: rows that an older schema let in, with
// topics no broker takes, are parked dead with the reason once the
// database is migrated, and every good row is delivered, once, in order.
func TestMigratedBadTopicsParkedDead(t *testing.T) {
	path := openV6(t)
	db, err := OpenDB(path, DBOptions{})
	require.NoError(t, err)
	var good []string
	for i, topic := range []string{"till/1", "$SYS/x", "till/2", "till/\x01", "till/\u0085", "till/3", "till/\uffff", "till/4"} {
		id := fmt.Sprintf("id-%d", i)
		_, err := db.Exec(`INSERT INTO outbox (id, topic, payload) VALUES (?, ?, '{}')`, id, topic)
		require.NoError(t, err, "schema 6 takes %q", topic)
		if strings.HasPrefix(topic, "till/") && ValidateTopic(topic) == nil && !strings.ContainsAny(topic, "\x01\u0085\uffff") {
			good = append(good, id)
		}
	}
	// A payload over the default limit, waiting when the schema changes:
	// the migration never parks what was accepted before.
	_, err = db.Exec(`INSERT INTO outbox (id, topic, payload) VALUES ('id-big', 'till/5', zeroblob(300000))`)
	require.NoError(t, err)
	good = append(good, "id-big")
	require.NoError(t, db.Close())
	ob := openTestPath(t, path, Options{})
	require.Equal(t, 300000, ob.MaxPayloadBytes(), "the limit starts at the largest payload waiting")
	pub := &fakePublisher{}
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 10*time.Second, "the outbox drained", func() bool { return countState(t, ob, "pending") == 0 })
	require.Equal(t, good, publishedIDs(t, pub), "the good rows, once each, in commit order")
	rows, err := ob.DB().Query(`SELECT topic, coalesce(last_error, '') FROM outbox_messages WHERE state = 'dead' ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	var dead int
	for rows.Next() {
		var topic, why string
		require.NoError(t, rows.Scan(&topic, &why))
		require.Contains(t, why, "invalid topic", "%q", topic)
		dead++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 4, dead)
}

// TestPayloadLimitHoldsForEveryWriter: the payload limit is stored in the
// database: a plain-SQL INSERT over it fails, as a TEXT payload or a BLOB,
// and so does Enqueue on an Outbox opened without the option.
func TestPayloadLimitHoldsForEveryWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	ob := openTestPath(t, path, Options{MaxPayloadBytes: 1000})
	_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('t', ?)`, bytes.Repeat([]byte("b"), 1000))
	require.NoError(t, err, "at the limit")
	_, err = ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('t', ?)`, bytes.Repeat([]byte("b"), 1001))
	require.ErrorContains(t, err, "payload too large", "a BLOB over the limit")
	_, err = ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('t', ?)`, strings.Repeat("é", 501))
	require.ErrorContains(t, err, "payload too large", "TEXT of 501 characters, 1002 bytes")
	other := openTestPath(t, path, Options{})
	ctx := context.Background()
	err = other.Transact(ctx, func(tx *sql.Tx) error {
		return other.Enqueue(ctx, tx, Message{Topic: "t", Payload: make([]byte, 1001)})
	})
	require.ErrorIs(t, err, ErrPayloadTooLarge, "another Outbox on the file, without the option")
	// The database is the one owner: lowered by another process, the limit
	// holds for an Outbox that read a higher one at Open.
	openTestPath(t, path, Options{MaxPayloadBytes: 500})
	err = ob.Transact(ctx, func(tx *sql.Tx) error {
		return ob.Enqueue(ctx, tx, Message{Topic: "t", Payload: make([]byte, 800)})
	})
	require.ErrorIs(t, err, ErrPayloadTooLarge, "the INSERT checks the stored limit")
}

// TestOversizedRowParkedWithoutLoading: a stored row over the payload
// limit (the limit lowered under it) is parked dead by the relay without
// its payload being read, and the rows behind it are delivered in order.
func TestOversizedRowParkedWithoutLoading(t *testing.T) {
	const big = 6 << 20
	path := filepath.Join(t.TempDir(), "outbox.db")
	ctx := context.Background()
	ob := openTestPath(t, path, Options{MaxPayloadBytes: 8 << 20})
	var ids []string
	for i, size := range []int{10, big, 10} {
		id := fmt.Sprintf("id-%d", i)
		ids = append(ids, id)
		require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, Message{ID: id, Topic: "t", Payload: bytes.Repeat([]byte{0xff}, size)})
		}))
	}
	require.NoError(t, ob.Close())
	ob = openTestPath(t, path, Options{MaxPayloadBytes: 1 << 20})
	pub := &fakePublisher{}
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	startRelay(t, r)
	eventually(t, 10*time.Second, "the outbox drained", func() bool { return countState(t, ob, "pending") == 0 })
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated while draining: %d bytes", alloc)
	require.Less(t, alloc, uint64(big/2), "the big payload was not read")
	require.Equal(t, []string{ids[0], ids[2]}, publishedIDs(t, pub))
	var why string
	require.NoError(t, ob.DB().QueryRow(`SELECT last_error FROM outbox_messages WHERE id = ? AND state = 'dead'`, ids[1]).Scan(&why))
	require.Contains(t, why, "payload too large")
	require.Contains(t, why, fmt.Sprintf("%d bytes, over the limit of %d", big, 1<<20))
}

// TestPayloadCapFitsTheTransport: the largest payload limit an Outbox
// takes, encoded in the worst case, still fits MQTT's largest packet, so
// Enqueue never accepts what the relay must then park dead for its size.
// The cap was MQTT's packet limit itself: a 210 MiB payload was taken and
// then parked dead after encoding to 280 MiB.
func TestPayloadCapFitsTheTransport(t *testing.T) {
	ob := openTest(t, Options{})
	_, err := New(context.Background(), ob.DB(), Options{MaxPayloadBytes: 210 << 20})
	require.Error(t, err, "a limit whose payloads cannot be carried")
	_, err = New(context.Background(), ob.DB(), Options{MaxPayloadBytes: MaxPayloadBytesLimit})
	require.NoError(t, err)

	pub, err := NewMQTTPublisher(MQTTOptions{Broker: "tcp://h:1"})
	require.NoError(t, err)
	topic := strings.Repeat("t", maxTopicBytes)
	props := &PublishProperties{ContentType: structuredContentType, MessageExpiry: time.Hour}
	require.NoError(t, pub.CheckSize(topic, maxEncodedBytes(MaxPayloadBytesLimit), props))
	require.Error(t, pub.CheckSize(topic, maxEncodedBytes(210<<20), props))

	// maxEncodedBytes bounds every envelope: the longest attributes, each
	// byte of them escaped, and every kind of payload.
	attr := strings.Repeat("<", maxTypeBytes)
	e := encoder{source: attr, defaultType: attr}
	for _, m := range []outgoing{
		{payload: bytes.Repeat([]byte{0xff}, 3001)},                       // bytes: base64
		{payload: bytes.Repeat([]byte{1}, 3001), text: true},              // text that escaping makes six times longer
		{payload: bytes.Repeat([]byte("<"), 3001), text: true},            // the same, by HTML-safe escaping
		{payload: []byte(`"` + strings.Repeat("a", 2999) + `"`)},          // inline JSON
		{payload: bytes.Repeat([]byte{1}, 3001), contentType: attr},       // a content type of its own
		{payload: bytes.Repeat([]byte("a"), 3001), text: true, typ: attr}, // plain text
	} {
		m.id, m.topic, m.seq, m.createdAt = strings.Repeat("&", MaxIDBytes), "t", 1<<62, 1<<62
		if m.typ == "" {
			m.typ = attr
		}
		b, err := e.encode(nil, &m)
		require.NoError(t, err)
		require.LessOrEqual(t, len(b), maxEncodedBytes(len(m.payload)), "%.40q", m.payload)
		m.createdAt = 0 // a time DecodeEvent reads
		b, err = e.encode(nil, &m)
		require.NoError(t, err)
		ev, err := DecodeEvent(b)
		require.NoError(t, err)
		require.Equal(t, m.payload, ev.Data, "the data survives")
	}
}

// topicRefuser is a Publisher whose transport refuses more topics than
// every transport does (as NATS refuses '.' in an MQTT-style topic).
type topicRefuser struct{ fakePublisher }

func (p *topicRefuser) CheckTopic(topic string) error {
	if strings.ContainsAny(topic, ". ") {
		return errors.New("a NATS subject cannot hold '.' or a space")
	}
	return nil
}

// TestTransportTopicCheck: a message whose topic the transport refuses
// (TopicChecker) is parked dead at once with the transport's reason, never
// published, and the messages behind it are delivered in order.
func TestTransportTopicCheck(t *testing.T) {
	ob := openTest(t, Options{})
	ctx := context.Background()
	var ids []string
	for i, topic := range []string{"a/b", "a.b/c", "a/c", "a b", "a/d"} {
		id := fmt.Sprintf("id-%d", i)
		ids = append(ids, id)
		require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, Message{ID: id, Topic: topic, Payload: []byte(`{}`)})
		}))
	}
	pub := &topicRefuser{}
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 10*time.Second, "the outbox drained", func() bool { return countState(t, ob, "pending") == 0 })
	require.Equal(t, []string{ids[0], ids[2], ids[4]}, publishedIDs(t, &pub.fakePublisher))
	for _, id := range []string{ids[1], ids[3]} {
		var why string
		var attempts int
		require.NoError(t, ob.DB().QueryRow(`SELECT last_error, attempts FROM outbox_messages WHERE id = ? AND state = 'dead'`, id).Scan(&why, &attempts))
		require.Contains(t, why, "NATS subject")
		require.Equal(t, 1, attempts, "parked at once")
	}
}

// smallTransport is a Publisher whose protocol carries at most 1 MiB.
type smallTransport struct{ fakePublisher }

func (p *smallTransport) CheckSize(topic string, payloadBytes int, props *PublishProperties) error {
	if len(topic)+payloadBytes > 1<<20 {
		return errors.New("over 1 MiB")
	}
	return nil
}

// TestRelayWarnsOfAPayloadLimitTheTransportCannotCarry: the stored limit is
// the core's; a transport that carries less (its SizeLimiter) makes
// NewRelay say so at start, rather than leave it to dead messages.
func TestRelayWarnsOfAPayloadLimitTheTransportCannotCarry(t *testing.T) {
	var logs harness.LogBuffer
	for _, limit := range []int{256 << 10, 4 << 20} {
		ob := openTest(t, Options{MaxPayloadBytes: limit, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		_, err := ob.NewRelay(&smallTransport{}, fastRelay())
		require.NoError(t, err)
	}
	require.Equal(t, 1, strings.Count(logs.String(), "lets in messages this transport cannot carry"), logs.String())
	require.Contains(t, logs.String(), "max_payload_bytes=4194304")
}

// TestMosquittoControlTopicsParked: rows with control characters in their
// topics, among good ones, let in by schema 6. Mosquitto closes the
// connection on such a PUBLISH (DISCONNECT 0x81), which took the relay
// through 28 reconnects and held the good event behind them for 90 s; now
// the relay parks them before they reach the connection: one connection,
// the good events delivered in commit order within seconds.
func TestMosquittoControlTopicsParked(t *testing.T) {
	path := openV6(t)
	db, err := OpenDB(path, DBOptions{})
	require.NoError(t, err)
	var goodSeqs []int64
	for i, topic := range []string{"till/1", "till/\x01bad", "till/2", "till/\u0085bad", "till/3"} {
		var seq int64
		require.NoError(t, db.QueryRow(`INSERT INTO outbox (topic, payload) VALUES (?, ?) RETURNING seq`, topic, fmt.Sprintf(`{"n":%d}`, i)).Scan(&seq))
		if !strings.HasSuffix(topic, "bad") {
			goodSeqs = append(goodSeqs, seq)
		}
	}
	require.NoError(t, db.Close())
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	sub := startPersistentSubscriber(t, m.Addr(), "control-topics-subscriber", "till/#")
	ob := openTestPath(t, path, Options{})
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: "tcp://" + m.Addr(), ClientID: "control-topics-relay", Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	start := time.Now()
	startRelay(t, r)
	eventually(t, 10*time.Second, "the good events received", func() bool { return sub.Log.Unique() == len(goodSeqs) })
	t.Logf("good events received after %v, %d connection attempts", time.Since(start).Round(time.Millisecond), r.Metrics().ConnectionAttempts)
	require.Equal(t, goodSeqs, sub.Log.Snapshot().FirstSeqs, "in commit order")
	require.EqualValues(t, 1, r.Metrics().ConnectionAttempts, "the broker never closed the connection")
	require.Equal(t, 2, countState(t, ob, "dead"))
}
