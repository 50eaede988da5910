package natsjs_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/consumer"
)

// TestBinaryModeRoundTrip: an event relayed in binary mode, with attribute
// values the headers must percent-encode (space, '%', '"', non-ASCII), comes
// out of the JetStream consumer as it went in.
func TestBinaryModeRoundTrip(t *testing.T) {
	s := startJS(t)
	s.stream(t, "POS", "pos.>")
	ob := openOutbox(t)
	const typ = `com.example.sale 50% "off" été`
	ctx := context.Background()
	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
		return ob.Enqueue(ctx, tx, outbox.Message{Topic: "pos/orders", Type: typ, Payload: []byte(`{"n":1}`)})
	}))
	runRelay(t, ob, newPublisher(t, s.url), outbox.EnvelopeCloudEventsBinary)

	db, err := outbox.OpenDB(t.TempDir()+"/consumer.db", outbox.DBOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	in, err := consumer.NewInbox(ctx, db, consumer.InboxOptions{})
	require.NoError(t, err)
	var mu sync.Mutex
	var got []outbox.Event
	c, err := consumer.NewJetStreamConsumer(in, func(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, ev)
		return nil
	}, consumer.JetStreamConsumerOptions{Servers: []string{s.url}, Stream: "POS", Durable: "apply"})
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); c.Run(cctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, 10*time.Second, "the event applied", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 1 })
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, typ, got[0].Type)
	require.Equal(t, "/natsjs-test", got[0].Source)
	require.JSONEq(t, `{"n":1}`, string(got[0].Data))
}
