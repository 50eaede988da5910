package bench

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"runtime"
	"time"

	"github.com/edgeoutbox/outbox"
)

const (
	benchTopic = "bench/stores/42/orders"
	benchType  = "com.example.order.created"
	payloadLen = 200
)

// openBench opens an outbox file with an orders table.
func (r *runner) openBench(ctx context.Context, name string, sync outbox.Synchronous) (*outbox.Outbox, error) {
	ob, err := outbox.Open(ctx, filepath.Join(r.dir, name), outbox.Options{Synchronous: sync, Logger: r.log, ReserveBytes: -1})
	if err != nil {
		return nil, err
	}
	// outbox_bare is the least an outbox row can be: a second b-tree with
	// a key and the message, nothing else (section 1's floor). outbox_plain
	// holds what Enqueue binds for such a message (an id, the type, the
	// time) with none of the schema's checks: between the two lies what the
	// message's own fields cost, above it what the outbox's guarantees do.
	if _, err := ob.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL, total_cents INTEGER NOT NULL);
		CREATE TABLE IF NOT EXISTS outbox_bare (seq INTEGER PRIMARY KEY, topic TEXT NOT NULL, payload BLOB NOT NULL);
		CREATE TABLE IF NOT EXISTS outbox_plain (seq INTEGER PRIMARY KEY, id TEXT, topic TEXT, payload BLOB, type TEXT, created_at INTEGER)`); err != nil {
		ob.Close()
		return nil, err
	}
	return ob, nil
}

// insertOrder is the business transaction's own work: one order row.
func insertOrder(ctx context.Context, tx *sql.Tx, n int) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO orders (item, total_cents) VALUES (?, ?)`, "coffee", 100+n%900)
	return err
}

// enqueueVariant is one way of writing a business transaction.
type enqueueVariant struct {
	key string
	tx  func(ctx context.Context, n int) error
}

func (r *runner) enqueue(ctx context.Context) error {
	sz := r.sz
	for _, mode := range []struct {
		name    string
		sync    outbox.Synchronous
		perTxns int
		steps   int
	}{{"full", outbox.SyncFull, sz.enqFullTx, sz.enqStepsFull}, {"normal", outbox.SyncNormal, sz.enqNormalTx, sz.enqStepsNormal}} {
		ob, err := r.openBench(ctx, "enqueue-"+mode.name+".db", mode.sync)
		if err != nil {
			return err
		}
		variants, closeVariants, err := enqueueVariants(ctx, ob)
		if err != nil {
			ob.Close()
			return err
		}
		rates := make(map[string][]float64)
		n := 0
		// A warm-up round, then interleaved rounds: A, B, C, … A, B, C.
		for round := -1; round < sz.enqRounds; round++ {
			for _, v := range variants {
				start := time.Now()
				for i := 0; i < mode.perTxns; i++ {
					n++
					if err := v.tx(ctx, n); err != nil {
						closeVariants()
						ob.Close()
						return fmt.Errorf("%s %s: %w", mode.name, v.key, err)
					}
				}
				if round >= 0 {
					rates[v.key] = append(rates[v.key], float64(mode.perTxns)/time.Since(start).Seconds())
				}
			}
			if ctx.Err() != nil {
				break
			}
		}
		med := map[string]float64{}
		for k, xs := range rates {
			med[k] = median(xs)
			r.rep.set("enqueue_"+mode.name+"_"+k+"_tx_per_s", med[k])
		}
		vsBusiness := med["library"] / med["business"]
		vsRaw := med["library"] / med["raw"]
		r.rep.set("enqueue_"+mode.name+"_library_vs_business", vsBusiness)
		r.rep.set("enqueue_"+mode.name+"_library_vs_raw", vsRaw)
		r.rep.set("enqueue_"+mode.name+"_library10_vs_raw10", med["library10"]/med["raw10"])
		r.rep.set("enqueue_"+mode.name+"_bare_vs_business", med["bare"]/med["business"])
		r.rep.set("enqueue_"+mode.name+"_library_vs_bare", med["library"]/med["bare"])
		r.rep.set("enqueue_"+mode.name+"_plain_vs_bare", med["plain"]/med["bare"])
		r.rep.set("enqueue_"+mode.name+"_library_vs_plain", med["library"]/med["plain"])
		r.rep.set("enqueue_"+mode.name+"_library_p9_vs_library", med["library_p9"]/med["library"])
		r.rep.set("enqueue_"+mode.name+"_added_us", (1/med["library"]-1/med["business"])*1e6)
		r.rep.check("enqueue_"+mode.name+"_library_vs_raw", vsRaw >= 0.95)
		if mode.name == "full" {
			r.rep.check("enqueue_full_library_vs_business", vsBusiness >= 0.90)
		}
		r.progress("  %s: business %.0f tx/s, bare %.0f, plain %.0f, raw %.0f, library %.0f (%.2f of business, %.2f of bare, %.2f of plain, %.2f of raw); batches of 10: raw %.0f, library %.0f",
			mode.name, med["business"], med["bare"], med["plain"], med["raw"], med["library"], vsBusiness, med["library"]/med["bare"], med["library"]/med["plain"], vsRaw, med["raw10"], med["library10"])

		if err := r.enqueueSteps(ctx, ob, mode.name, variants, mode.steps); err != nil {
			closeVariants()
			ob.Close()
			return err
		}
		if mode.name == "normal" {
			if err := r.allocs(ctx, variants); err != nil {
				closeVariants()
				ob.Close()
				return err
			}
		}
		closeVariants()
		if err := ob.Close(); err != nil {
			return err
		}
	}
	r.rep.note(1, "Each figure is the median of %d interleaved rounds (business, bare, plain, raw, library, raw ×10, library ×10, library at priority 9, repeated) of %d transactions at FULL and %d at NORMAL, "+
		"on one file per setting. Business transaction: one order row. Bare: the same plus a row in a table of three columns (seq, topic, payload) with no index or trigger — the least any outbox row costs. "+
		"Plain: the same plus a row of the fields Enqueue binds (a new id, topic, payload, type, created time) in a table with no constraint, index or trigger. "+
		"Raw: the same plus a prepared `INSERT INTO outbox (topic, type, payload)`; library: the same through `Transact` + `Enqueue`. "+
		"Payloads are %d-byte JSON documents. Ratios are of transactions per second. "+
		"Steps: the business transaction plus one row, the schema built up from the bare row — the fields Enqueue binds (plain), the outbox table's other columns, its CHECK, its indexes, its trigger (the outbox table itself, by SQL), then Enqueue — "+
		"taking turns one transaction at a time in a new random order each turn (%d turns at FULL, %d at NORMAL); each step's figure is the median time of its transactions, which leaves out the checkpoints that the rounds share.",
		sz.enqRounds, sz.enqFullTx, sz.enqNormalTx, payloadLen, sz.enqStepsFull, sz.enqStepsNormal)
	return nil
}

// floorTx is the business transaction plus one row written by st, with the
// arguments args gives for each transaction: a floor, or a step of the
// schema (enqueuesteps.go).
func floorTx(ob *outbox.Outbox, st *sql.Stmt, args func() []any) func(ctx context.Context, n int) error {
	return func(ctx context.Context, n int) error {
		return ob.Transact(ctx, func(tx *sql.Tx) error {
			if err := insertOrder(ctx, tx, n); err != nil {
				return err
			}
			txSt := tx.StmtContext(ctx, st)
			defer txSt.Close()
			_, err := txSt.ExecContext(ctx, args()...)
			return err
		})
	}
}

// plainRow gives the arguments of a row of the fields Enqueue binds for a
// message with no content type or expiry (id, topic, payload, type, created
// time), made afresh per transaction as Enqueue makes them.
func plainRow(pl []byte) func() []any {
	return func() []any { return []any{outbox.NewID(), benchTopic, pl, benchType, time.Now().UnixMilli()} }
}

// enqueueVariants returns the business transaction alone, with a raw SQL
// insert into the outbox, and through the library; and the same two with
// ten messages.
func enqueueVariants(ctx context.Context, ob *outbox.Outbox) ([]enqueueVariant, func(), error) {
	db := ob.DB()
	raw, err := db.PrepareContext(ctx, `INSERT INTO outbox (topic, type, payload) VALUES (?, ?, ?)`)
	if err != nil {
		return nil, nil, err
	}
	bare, err := db.PrepareContext(ctx, `INSERT INTO outbox_bare (topic, payload) VALUES (?, ?)`)
	if err != nil {
		raw.Close()
		return nil, nil, err
	}
	plain, err := db.PrepareContext(ctx, `INSERT INTO outbox_plain (id, topic, payload, type, created_at) VALUES (?, ?, ?, ?, ?)`)
	if err != nil {
		raw.Close()
		bare.Close()
		return nil, nil, err
	}
	pl := payload(0, payloadLen)
	msgs := make([]outbox.Message, 10)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: benchTopic, Type: benchType, Payload: pl}
	}
	// A priority above 0 takes an insert of its own and the index of such
	// rows.
	p9 := []outbox.Message{{Topic: benchTopic, Type: benchType, Payload: pl, Priority: 9}}
	rawTx := func(k int) func(ctx context.Context, n int) error {
		return func(ctx context.Context, n int) error {
			return ob.Transact(ctx, func(tx *sql.Tx) error {
				if err := insertOrder(ctx, tx, n); err != nil {
					return err
				}
				st := tx.StmtContext(ctx, raw)
				defer st.Close()
				for i := 0; i < k; i++ {
					if _, err := st.ExecContext(ctx, benchTopic, benchType, pl); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	libTx := func(msgs []outbox.Message) func(ctx context.Context, n int) error {
		return func(ctx context.Context, n int) error {
			return ob.Transact(ctx, func(tx *sql.Tx) error {
				if err := insertOrder(ctx, tx, n); err != nil {
					return err
				}
				return ob.Enqueue(ctx, tx, msgs...)
			})
		}
	}
	return []enqueueVariant{
		{"business", func(ctx context.Context, n int) error {
			return ob.Transact(ctx, func(tx *sql.Tx) error { return insertOrder(ctx, tx, n) })
		}},
		{"bare", floorTx(ob, bare, func() []any { return []any{benchTopic, pl} })},
		{"plain", floorTx(ob, plain, plainRow(pl))},
		{"raw", rawTx(1)},
		{"library", libTx(msgs[:1])},
		{"raw10", rawTx(10)},
		{"library10", libTx(msgs)},
		{"library_p9", libTx(p9)},
	}, func() { raw.Close(); bare.Close(); plain.Close() }, nil
}

// allocs measures heap allocations per transaction of each variant, and
// from them what Enqueue adds per message.
func (r *runner) allocs(ctx context.Context, variants []enqueueVariant) error {
	const txns = 2000
	per := map[string][2]float64{} // allocs, bytes per transaction
	var ms runtime.MemStats
	for _, v := range variants {
		if v.key != "business" && v.key != "library" && v.key != "library10" {
			continue
		}
		runtime.GC()
		runtime.ReadMemStats(&ms)
		m0, b0 := ms.Mallocs, ms.TotalAlloc
		for i := 0; i < txns; i++ {
			if err := v.tx(ctx, i); err != nil {
				return err
			}
		}
		runtime.ReadMemStats(&ms)
		per[v.key] = [2]float64{float64(ms.Mallocs-m0) / txns, float64(ms.TotalAlloc-b0) / txns}
	}
	r.rep.set("enqueue_allocs_per_message", per["library"][0]-per["business"][0])
	r.rep.set("enqueue_alloc_bytes_per_message", per["library"][1]-per["business"][1])
	r.rep.set("enqueue_allocs_per_message_batch10", (per["library10"][0]-per["business"][0])/10)
	r.rep.set("enqueue_business_allocs_per_tx", per["business"][0])
	return nil
}
