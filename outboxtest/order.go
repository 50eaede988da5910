package outboxtest

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// order: a backlog committed before the relay starts, then a live stream
// from two writers at once while it runs, each with a transaction that
// rolls back. Every committed event arrives once, first deliveries in
// commit order; nothing of a rolled-back transaction is published; no
// fault, so no duplicate, and every row is sent with no attempt charged.
func order(t *testing.T, tr Transport) {
	x := newFixture(t, tr.Broker(t), tr.Features)
	topic := x.broker.Topic
	backlog, live := 200*scale(t), 50*scale(t)

	x.commit(topic, backlog/2)
	rolledBack := []string{x.rollBack(topic)}
	x.commit(topic, backlog-backlog/2)

	rr := x.start(relayOptions())
	x.delivered(backlog, "the backlog")
	x.speaks(rr)

	// Two writers commit at once: commit order is the order their commits
	// got their sequence numbers, whatever the writers' interleaving.
	var wg sync.WaitGroup
	errs := make(chan error, 2*(live+1))
	var mu sync.Mutex
	for range 2 {
		wg.Go(func() {
			for i := range live {
				if i == live/2 {
					id, err := x.tryRollBack(topic)
					if err != nil {
						errs <- err
					}
					mu.Lock()
					rolledBack = append(rolledBack, id)
					mu.Unlock()
				}
				if err := x.commitOne(topic); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	total := backlog + 2*live
	x.delivered(total, "the backlog and the live stream")
	waitFor(t, patience, "every row marked sent", func() bool { return x.count(outbox.StateSent) == total })

	rows := x.rows()
	require.Len(t, rows, total, "rows committed")
	x.got.matches(t, rows, 0)
	for _, id := range rolledBack {
		require.False(t, x.got.has(id), "an event of a rolled-back transaction delivered")
	}
	x.noneCharged(rr)
	t.Logf("%d events (a backlog of %d, then %d from two writers at once) delivered in commit order, no duplicate, %d rolled back and never published",
		total, backlog, 2*live, len(rolledBack))
}
