package outbox

import (
	"context"
	"database/sql"
	"testing"
)

// BenchmarkDataVersion is the cost of one idle poll of the relay.
func BenchmarkDataVersion(b *testing.B) {
	ob := openTest(b, Options{})
	c, err := ob.DB().Conn(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var v int64
	for b.Loop() {
		if err := c.QueryRowContext(context.Background(), `PRAGMA data_version`).Scan(&v); err != nil {
			b.Fatal(err)
		}
	}
}

func benchTx(b *testing.B, ob *Outbox, withOutbox, rawSQL bool, batch int) {
	ctx := context.Background()
	payload := make([]byte, 200)
	for i := range payload {
		payload[i] = 'x'
	}
	msgs := make([]Message, batch)
	for i := range msgs {
		msgs[i] = Message{Topic: "pos/1/orders", Payload: payload}
	}
	b.ReportAllocs()
	for b.Loop() {
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			if _, err := tx.Exec(`INSERT INTO orders (item) VALUES ('coffee')`); err != nil {
				return err
			}
			switch {
			case !withOutbox:
				return nil
			case rawSQL:
				for range batch {
					if _, err := tx.Exec(`INSERT INTO outbox (topic, payload) VALUES (?, ?)`, "pos/1/orders", payload); err != nil {
						return err
					}
				}
				return nil
			default:
				return ob.Enqueue(ctx, tx, msgs...)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// The enqueue benchmarks compare the business transaction alone, with a raw
// SQL outbox insert, and with Enqueue, at synchronous=NORMAL (FULL is
// dominated by fsync; see outboxlab bench for both).
func BenchmarkTxBusinessOnly(b *testing.B) {
	benchTx(b, openTest(b, Options{Synchronous: SyncNormal}), false, false, 1)
}
func BenchmarkTxRawSQLInsert(b *testing.B) {
	benchTx(b, openTest(b, Options{Synchronous: SyncNormal}), true, true, 1)
}
func BenchmarkTxEnqueue(b *testing.B) {
	benchTx(b, openTest(b, Options{Synchronous: SyncNormal}), true, false, 1)
}
func BenchmarkTxEnqueue10(b *testing.B) {
	benchTx(b, openTest(b, Options{Synchronous: SyncNormal}), true, false, 10)
}
func BenchmarkTxRawSQL10(b *testing.B) {
	benchTx(b, openTest(b, Options{Synchronous: SyncNormal}), true, true, 10)
}

func BenchmarkEncodeCloudEvents(b *testing.B) {
	enc := encoder{source: "/outbox/device", defaultType: DefaultEventType}
	m := &outgoing{seq: 123456, id: NewID(), topic: "pos/1/orders", payload: []byte(`{"order":12345,"items":[{"sku":"A1","qty":2}],"total":12.50}`), createdAt: 1700000000000}
	b.ReportAllocs()
	buf := make([]byte, 0, 1024)
	for b.Loop() {
		if _, err := enc.encode(buf[:0], m); err != nil {
			b.Fatal(err)
		}
	}
}
