package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDuplicateClientID: two devices configured with the same client id
// knock each other off the broker (it drops the older connection for the
// newer). Both must still deliver everything, and the connection losses
// must not be blamed on the messages in flight.
func TestDuplicateClientID(t *testing.T) { forProtocols(t, testDuplicateClientID) }

func testDuplicateClientID(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	var obs []*Outbox
	var relays []*Relay
	for i := 0; i < 2; i++ {
		ob := openTest(t, Options{})
		pub, err := NewMQTTPublisher(MQTTOptions{Broker: b.url(), ClientID: "same-id", ConnectTimeout: 2 * time.Second, WriteTimeout: time.Second, Protocol: proto})
		require.NoError(t, err)
		t.Cleanup(func() { pub.Close() })
		opts := fastRelay()
		opts.Source = []string{"/till/a", "/till/b"}[i]
		r, err := ob.NewRelay(pub, opts)
		require.NoError(t, err)
		obs, relays = append(obs, ob), append(relays, r)
	}
	for _, r := range relays {
		startRelay(t, r)
	}
	start := time.Now()
	const each = 200 // 2,000 each took 33 s here, against under a second with distinct ids
	for n := 0; n < 2*each; n++ {
		commitOrder(t, obs[n%2], "pos/orders", n)
	}
	for i, ob := range obs {
		eventually(t, 120*time.Second, "every message sent", func() bool { return countState(t, ob, "sent") == each })
		require.Zero(t, countState(t, ob, "dead"), "device %d", i)
		var charged int
		require.NoError(t, ob.DB().QueryRow(`SELECT coalesce(sum(attempts), 0) FROM outbox`).Scan(&charged))
		t.Logf("device %d: all sent, %d attempts charged", i, charged)
	}
	s, err := relays[0].Stats(context.Background())
	require.NoError(t, err)
	t.Logf("%d messages in %s; last error of device 0: %s", 2*each, time.Since(start).Round(time.Millisecond), s.LastError)
}
