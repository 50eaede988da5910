package outbox

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRequeueChosenIDs: a dead message whose id the writer chose (a
// business key, in the unique index) used to make RequeueDead fail for every
// dead message: the copy was inserted before the original was deleted.
// Dead messages must always be requeueable.
func TestRequeueChosenIDs(t *testing.T) {
	ctx := context.Background()
	ob := openTest(t, Options{MaxPendingMessages: 10, MaxPendingBytes: 1000})
	for _, m := range []Message{
		{ID: "order-1", Topic: "elsewhere/a", Payload: []byte(`"a"`)},
		{Topic: "elsewhere/b", Payload: []byte(`"b"`)}, // a UUIDv7
		{ID: "order-3", Topic: "elsewhere/c", Payload: []byte(`"c"`)},
	} {
		require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, m) }))
	}
	opts := fastRelay()
	opts.TopicPrefix = "till/"
	opts.Envelope = EnvelopeRaw
	r, err := ob.NewRelay(&fakePublisher{}, opts)
	require.NoError(t, err)
	stop := startRelay(t, r)
	eventually(t, 5*time.Second, "all dead", func() bool { return countState(t, ob, "dead") == 3 })
	stop()

	n, err := ob.Requeue(ctx, "order-1")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	checkCounters(t, ob.DB())
	n, err = ob.RequeueDead(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	checkCounters(t, ob.DB())
	recs, err := ob.List(ctx, ListOptions{})
	require.NoError(t, err)
	require.Len(t, recs, 3)
	require.Equal(t, "order-1", recs[0].ID, "requeued first, so first again")
	require.Equal(t, "order-3", recs[2].ID, "the rest in their order")
	for i, rec := range recs {
		require.Greater(t, rec.Seq, int64(3), "a new number at the end")
		require.Zero(t, rec.Attempts)
		require.Empty(t, rec.LastError)
		if i > 0 {
			require.Greater(t, rec.Seq, recs[i-1].Seq)
		}
	}

	// Requeued, they are published, in their new order.
	pub := &fakePublisher{}
	opts.TopicPrefix = ""
	r, err = ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 5*time.Second, "published", func() bool { return pub.publishedCount() == 3 })
	pub.mu.Lock()
	require.Equal(t, []string{`"a"`, `"b"`, `"c"`}, pub.published)
	pub.mu.Unlock()
}

// TestStatsOldestPendingAndLease: OldestPending is the earliest creation
// time among pending messages, a requeued one included, which waits at the
// back of the line (it was the first in line's: an hour younger here);
// LeaseExpires is the zero time while no relay holds the lease, as
// OldestPending is when nothing waits (it was 1970-01-01).
func TestStatsOldestPendingAndLease(t *testing.T) {
	ctx := context.Background()
	ob := openTest(t, Options{})
	st, err := ob.Stats(ctx)
	require.NoError(t, err)
	require.True(t, st.OldestPending.IsZero())
	require.True(t, st.LeaseExpires.IsZero(), "no lease: %v", st.LeaseExpires)

	commitOrder(t, ob, "t", 1)
	commitOrder(t, ob, "t", 2)
	old := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	_, err = ob.DB().Exec(`UPDATE outbox SET created_at = ?, dead_at = ?, attempts = 5 WHERE seq = 1`, old.UnixMilli(), old.UnixMilli())
	require.NoError(t, err)
	n, err := ob.RequeueDead(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	st, err = ob.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Pending)
	require.True(t, st.OldestPending.Equal(old), "oldest pending %v, want the requeued message's %v", st.OldestPending, old)

	r, err := ob.NewRelay(&fakePublisher{}, fastRelay())
	require.NoError(t, err)
	stop := startRelay(t, r)
	eventually(t, 5*time.Second, "the relay holds the lease", func() bool {
		st, err := ob.Stats(ctx)
		return err == nil && st.LeaseOwner != "" && st.LeaseExpires.After(time.Now().Add(-time.Hour))
	})
	stop()
	st, err = ob.Stats(ctx)
	require.NoError(t, err)
	require.Empty(t, st.LeaseOwner)
	require.True(t, st.LeaseExpires.IsZero(), "lease released: %v", st.LeaseExpires)
}
