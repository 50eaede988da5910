package consumer

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// TestJetStreamConsumerPartitions: a Durable per partition of the subjects,
// each with its FilterSubject, keeps each store's order: two stores'
// events, interleaved in the stream, are applied by their partition's
// member only, each store's in commit order. A member given a
// FilterSubject that the existing Durable does not have refuses to bind,
// saying why, and applies nothing.
func TestJetStreamConsumerPartitions(t *testing.T) {
	const n = 60
	s := startJetStream(t)
	for seq := 1; seq <= n; seq++ {
		for store := 1; store <= 2; store++ {
			id := outbox.NewID()
			s.publish(t, fmt.Sprintf("pos.store%d.sales", store), id, fmt.Appendf(nil,
				`{"specversion":"1.0","id":%q,"source":"/stores/%d","type":"pos.sale","sequence":"%d","data":{}}`, id, store, seq), nil)
		}
	}
	members := map[int]*sql.DB{}
	for store := 1; store <= 2; store++ {
		db := consumerDB(t, fmt.Sprintf("%s/store%d.db", t.TempDir(), store))
		in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
		require.NoError(t, err)
		c, _ := runJetStreamConsumer(t, in, recordApplied, JetStreamConsumerOptions{
			Servers: []string{s.url}, Durable: fmt.Sprintf("store%d", store), FilterSubject: fmt.Sprintf("pos.store%d.>", store), Batch: 8,
		})
		eventually(t, 15*time.Second, fmt.Sprintf("store %d's events applied", store), func() bool { return c.Stats().Applied == n })
		members[store] = db
	}
	for store, db := range members {
		require.Equal(t, oneToN(n), appliedSeqs(t, db), "store %d's events once, in commit order", store)
		var sources []string
		rows, err := db.Query(`SELECT DISTINCT source FROM applied`)
		require.NoError(t, err)
		for rows.Next() {
			var src string
			require.NoError(t, rows.Scan(&src))
			sources = append(sources, src)
		}
		require.NoError(t, rows.Err())
		rows.Close()
		require.Equal(t, []string{fmt.Sprintf("/stores/%d", store)}, sources, "its partition's events only")
	}

	db := consumerDB(t, t.TempDir()+"/stray.db")
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	s.publish(t, "pos.store1.sales", outbox.NewID(), jsEvent(outbox.NewID(), n+1), nil)
	stray, _ := runJetStreamConsumer(t, in, recordApplied, JetStreamConsumerOptions{
		Servers: []string{s.url}, Durable: "store1", FilterSubject: "pos.store2.>",
	})
	eventually(t, 10*time.Second, "the stray member says why it does not bind", func() bool {
		return strings.Contains(stray.Stats().LastError, `consumer store1 on stream EVENTS filters "pos.store1.>", not FilterSubject "pos.store2.>"`)
	})
	require.Zero(t, stray.Stats().Applied)
	require.Zero(t, appliedCount(t, db))
}
