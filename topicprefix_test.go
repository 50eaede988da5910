package outbox

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTopicPrefixRefusedAtEnqueue(t *testing.T) {
	ob := openTest(t, Options{TopicPrefix: "acme/till-1/"})
	ctx := context.Background()
	err := ob.Transact(ctx, func(tx *sql.Tx) error {
		if _, err := tx.Exec(`INSERT INTO orders (item) VALUES ('x')`); err != nil {
			return err
		}
		return ob.Enqueue(ctx, tx, Message{Topic: "acme/till-1/orders"}, Message{Topic: "acme/till-2/orders"})
	})
	require.ErrorIs(t, err, ErrTopicOutsidePrefix)
	require.ErrorIs(t, err, ErrInvalidTopic)
	require.Contains(t, err.Error(), `"acme/till-2/orders" is not under "acme/till-1/"`)
	require.Zero(t, countState(t, ob, "pending"), "nothing written")
	var orders int
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM orders`).Scan(&orders))
	require.Zero(t, orders, "the business row rolled back with it")

	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
		return ob.Enqueue(ctx, tx, Message{Topic: "acme/till-1/orders"})
	}))
	require.Equal(t, 1, countState(t, ob, "pending"))

	_, err = New(ctx, ob.DB(), Options{TopicPrefix: "acme/#"})
	require.ErrorIs(t, err, ErrTopicWildcard, "a prefix no topic could start with")
	_, err = ob.NewRelay(&fakePublisher{}, RelayOptions{TopicPrefix: "acme/+/"})
	require.True(t, errors.Is(err, ErrInvalidTopic))
}

// A row outside the prefix written by plain SQL (another language, where
// Enqueue cannot check) is parked as dead at once by a relay with the
// prefix; the rest is delivered in order.
func TestTopicPrefixAtTheRelay(t *testing.T) { forProtocols(t, testTopicPrefixAtTheRelay) }

func testTopicPrefixAtTheRelay(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	ob := openTest(t, Options{})
	for _, topic := range []string{"acme/till-1/orders", "acme/till-2/orders", "acme/till-1/orders"} {
		_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES (?, '{}')`, topic)
		require.NoError(t, err)
	}
	opts := fastRelay()
	opts.TopicPrefix = "acme/till-1/"
	startRelay(t, mqttRelayOn(t, ob, b.url(), opts, proto))
	eventually(t, 10*time.Second, "two sent, one dead", func() bool {
		return countState(t, ob, "sent") == 2 && countState(t, ob, "dead") == 1
	})
	state, _ := rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	var lastErr string
	require.NoError(t, ob.DB().QueryRow(`SELECT last_error FROM outbox WHERE seq = 2`).Scan(&lastErr))
	require.Contains(t, lastErr, "outside this device's topic prefix")
	require.Zero(t, checkOrdered(t, b.rec, 2))
}
