package examples_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestConsumersJetStreamMemberKilled: three consumer processes (the
// examples/consumer program with --nats) are members of one JetStream
// durable pull consumer and share one PostgreSQL inbox. One is killed with
// SIGKILL while it applies, and not started again: every event in the
// stream is applied exactly once (one row per event in orders_seen, written
// in the Inbox's transaction), within the ack wait and a few seconds of the
// kill, as the others take what the dead one held.
func TestConsumersJetStreamMemberKilled(t *testing.T) {
	const events, ackWait = 1000, 2 * time.Second
	consumerBin := build(t, "consumer")
	n := harness.StartNATS(t)
	pg := harness.StartPostgres(t, harness.PostgresOptions{})
	dsn := pg.NewDatabase(t)
	dir := t.TempDir()

	nc, err := nats.Connect("nats://" + n.Addr)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"stores.>"}})
	require.NoError(t, err)
	// Every event is in the stream first: each pull is a full batch, so the
	// member killed holds messages it has not applied.
	published := map[string]bool{}
	for i := 1; i <= events; i++ {
		id := outbox.NewID()
		published[id] = true
		doc := fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"/stores/%d/tills/1","type":"com.example.pos.OrderPlaced","sequence":"%d","data":{"n":%d}}`, id, i%3+1, i, i)
		_, err := js.Publish(ctx, fmt.Sprintf("stores.%d.orders", i%3+1), doc, jetstream.WithMsgID(id))
		require.NoError(t, err)
	}

	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	count := func(where string, args ...any) (k int) {
		if err := db.QueryRow(`SELECT count(*) FROM orders_seen `+where, args...).Scan(&k); err != nil {
			t.Logf("count: %v", err) // the table is created by the first consumer
		}
		return k
	}

	const consumers = 3
	procs := make([]*harness.Program, consumers)
	for i := range consumers {
		log := filepath.Join(dir, fmt.Sprintf("consumer-%d.log", i))
		procs[i] = harness.StartProgram(t, fmt.Sprintf("consumer-%d", i), log, consumerBin,
			"--nats", "nats://"+n.Addr, "--stream", "EVENTS", "--durable", "backend", "--ack-wait", ackWait.String(),
			"--postgres", dsn, "--client-id", fmt.Sprintf("js-%d", i))
		t.Cleanup(func() {
			if t.Failed() {
				b, _ := os.ReadFile(log)
				t.Logf("consumer-%d:\n%s", i, b)
			}
		})
	}
	harness.Eventually(t, 60*time.Second, "consumer js-0 applying", func() bool { return count(`WHERE consumer = 'js-0'`) >= 10 })
	procs[0].Kill()
	killed := time.Now()
	before := count(``)
	harness.Eventually(t, ackWait+5*time.Second, "every event applied", func() bool { return count(``) >= events })
	t.Logf("killed js-0 at %d of %d applied; all applied %v later (ack wait %v); per member: %d, %d, %d", before, events,
		time.Since(killed).Round(time.Millisecond), ackWait,
		count(`WHERE consumer = 'js-0'`), count(`WHERE consumer = 'js-1'`), count(`WHERE consumer = 'js-2'`))
	require.Less(t, before, events, "the kill fell while events were applied")

	// Exactly once: one row per event in the stream, none else.
	rows, err := db.Query(`SELECT id FROM orders_seen`)
	require.NoError(t, err)
	defer rows.Close()
	seen := map[string]int{}
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		seen[id]++
	}
	require.NoError(t, rows.Err())
	var twice, unknown []string
	for id, k := range seen {
		if k > 1 {
			twice = append(twice, id)
		}
		if !published[id] {
			unknown = append(unknown, id)
		}
	}
	require.Empty(t, twice, "applied more than once")
	require.Empty(t, unknown, "applied but never published")
	require.Len(t, seen, events, "every event applied")
	require.False(t, procs[1].Exited() || procs[2].Exited(), "the survivors run on")
}
