package consumer

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestEndToEndKillBothSides runs two producers (outbox + relay) and one
// consumer (inbox + subscriber) through a real Mosquitto, stopping both
// sides abruptly at random moments — relays abandon what is in flight,
// the consumer drops acknowledgements after committing — and ends with
// every committed event applied exactly once, in order per source.
func TestEndToEndKillBothSides(t *testing.T) { forProtocols(t, testEndToEndKillBothSides) }

func testEndToEndKillBothSides(t *testing.T, proto outbox.MQTTProtocol) {
	if testing.Short() {
		t.Skip("-short")
	}
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	broker := m.URL()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	var rngMu sync.Mutex
	randDur := func(lo, hi time.Duration) time.Duration {
		rngMu.Lock()
		defer rngMu.Unlock()
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The consumer: its own database, an inbox, a handler that records
	// what it applied.
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(ctx, db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	var consumerKills, producerKills atomic.Int64
	var skipped int64 // redeliveries the inbox recognised
	var wg sync.WaitGroup
	stopConsumer := make(chan struct{})
	wg.Add(1)
	go func() { // the consumer, killed and restarted until told to stop
		defer wg.Done()
		for {
			sctx, kill := context.WithCancel(ctx)
			dropAfter := randDur(0, 400*time.Millisecond)
			start := time.Now()
			s, err := NewSubscriber(in, recordApplied, SubscriberOptions{
				Broker: broker, ClientID: "e2e-consumer", Topics: []string{"e2e/#"},
				Reconnect: outbox.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
				KeepAlive: 2 * time.Second, PingTimeout: time.Second, Logger: testLogger(),
				beforeAck: func(outbox.Event) bool {
					if time.Since(start) < dropAfter {
						return true
					}
					// Committed, and the process dies before the PUBACK.
					kill()
					return false
				},
			})
			if err != nil {
				t.Error(err)
				kill()
				return
			}
			done := make(chan struct{})
			go func() { defer close(done); s.Run(sctx) }()
			select {
			case <-done:
			case <-time.After(randDur(100*time.Millisecond, 700*time.Millisecond)):
			case <-stopConsumer:
			}
			kill()
			<-done
			skipped += s.Stats().Duplicates
			select {
			case <-stopConsumer:
				return
			default:
				consumerKills.Add(1)
			}
		}
	}()

	type producer struct {
		ob        *outbox.Outbox
		source    string
		committed int
	}
	producers := []*producer{{source: "/tills/1"}, {source: "/tills/2"}}
	stopRelays := make(chan struct{})
	var relayWG sync.WaitGroup
	for i, p := range producers {
		p.ob = openTest(t, outbox.Options{})
		relayWG.Add(1)
		go func() { // this producer's relay, killed and restarted
			defer relayWG.Done()
			for {
				pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: broker, ClientID: fmt.Sprintf("e2e-till-%d", i), KeepAlive: 2 * time.Second, PingTimeout: time.Second, WriteTimeout: time.Second, Protocol: proto})
				if err != nil {
					t.Error(err)
					return
				}
				opts := fastRelay()
				opts.Source = p.source
				opts.ShutdownTimeout = time.Millisecond // abandon what is in flight, as a crash would
				r, err := p.ob.NewRelay(pub, opts)
				if err != nil {
					t.Error(err)
					return
				}
				rctx, kill := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() { defer close(done); r.Run(rctx) }()
				var stop bool
				select {
				case <-time.After(randDur(50*time.Millisecond, 500*time.Millisecond)):
				case <-stopRelays:
					stop = true
				}
				kill()
				<-done
				pub.Close()
				if stop {
					return
				}
				producerKills.Add(1)
			}
		}()
	}

	// The tills sell while both sides are being killed: 400 events each at
	// least, and on until each side was killed 8 times (the relay drains
	// faster than the tills sell, so a count of events alone would let the
	// test end before it killed much).
	const minKills = 8
	killedEnough := func() bool { return producerKills.Load() >= minKills && consumerKills.Load() >= minKills }
	var writers sync.WaitGroup
	for _, p := range producers {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := 0; i < 400 || (!killedEnough() && i < 4000); i++ {
				err := p.ob.Transact(ctx, func(tx *sql.Tx) error {
					return p.ob.Enqueue(ctx, tx, outbox.Message{Topic: "e2e/orders", Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
				})
				if err != nil {
					t.Error(err)
					return
				}
				p.committed++
				time.Sleep(randDur(0, 4*time.Millisecond)) // the till's pace, not synchronisation
			}
		}()
	}
	writers.Wait()
	total := producers[0].committed + producers[1].committed

	// Let the killing stop and everything settle.
	close(stopRelays)
	relayWG.Wait()
	for _, p := range producers {
		pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: broker, ClientID: "e2e-final-" + p.source[7:], Protocol: proto})
		require.NoError(t, err)
		t.Cleanup(func() { pub.Close() })
		opts := fastRelay()
		opts.Source = p.source
		r, err := p.ob.NewRelay(pub, opts)
		require.NoError(t, err)
		startRelay(t, r)
	}
	close(stopConsumer)
	wg.Wait()
	s, err := NewSubscriber(in, recordApplied, SubscriberOptions{
		Broker: broker, ClientID: "e2e-consumer", Topics: []string{"e2e/#"}, Logger: testLogger(),
		Reconnect: outbox.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
	})
	require.NoError(t, err)
	sctx, stopFinal := context.WithCancel(ctx)
	finalDone := make(chan struct{})
	go func() { defer close(finalDone); s.Run(sctx) }()
	defer func() { stopFinal(); <-finalDone }()
	eventually(t, 60*time.Second, "every event applied", func() bool { return appliedCount(t, db) >= total })

	t.Logf("events committed %d (two sources), relay kills %d, consumer kills %d, redeliveries skipped by the inbox after the kills: %d",
		total, producerKills.Load(), consumerKills.Load(), skipped+s.Stats().Duplicates)
	var distinct int
	require.NoError(t, db.QueryRow(`SELECT count(DISTINCT source || ' ' || id) FROM applied`).Scan(&distinct))
	require.Equal(t, total, appliedCount(t, db), "no event applied twice")
	require.Equal(t, total, distinct, "every event applied")
	rows, err := db.Query(`SELECT source, seq FROM applied ORDER BY rowid`)
	require.NoError(t, err)
	defer rows.Close()
	last := map[string]int64{}
	for rows.Next() {
		var src string
		var seq int64
		require.NoError(t, rows.Scan(&src, &seq))
		require.Greater(t, seq, last[src], "applied out of order for %s", src)
		last[src] = seq
	}
	require.NoError(t, rows.Err())
	require.GreaterOrEqual(t, producerKills.Load(), int64(minKills), "relays killed")
	require.GreaterOrEqual(t, consumerKills.Load(), int64(minKills), "consumers killed")
}
