package consumer

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/mqtt"
)

// TestSubscriberMaxPacketBytes: the Subscriber passes MaxPacketBytes to its
// sessions, announced over MQTT 5 as the Maximum Packet Size; by default
// it holds the largest batch a relay makes, with room for its topic and
// properties; a negative one is refused.
func TestSubscriberMaxPacketBytes(t *testing.T) {
	require.GreaterOrEqual(t, mqtt.DefaultMaxPacketBytes, outbox.MaxBatchBytesLimit+512<<10)
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	for _, c := range []struct{ set, want int }{{0, mqtt.DefaultMaxPacketBytes}, {200_000, 200_000}} {
		b := harness.StartFakeBroker(t, harness.FakeBrokerOptions{})
		s, err := NewSubscriber(in, recordApplied, SubscriberOptions{Broker: b.URL(), ClientID: "consumer-1",
			Topics: []string{"pos/#"}, Protocol: outbox.Protocol5, MaxPacketBytes: c.set, Logger: testLogger()})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		require.Eventually(t, func() bool { return len(b.Connects()) > 0 && b.Connects()[0].Level == 5 },
			10*time.Second, 5*time.Millisecond)
		cancel()
		require.NoError(t, <-done)
		require.EqualValues(t, c.want, b.Connects()[0].MaxPacket)
	}
	_, err = NewSubscriber(in, recordApplied, SubscriberOptions{Broker: "tcp://127.0.0.1:1883", ClientID: "c",
		Topics: []string{"pos/#"}, MaxPacketBytes: -1})
	require.ErrorContains(t, err, "MaxPacketBytes -1 is negative")
}
