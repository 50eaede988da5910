//go:build linux

package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestRabbitMQCompatibility runs the relay's core cases against RabbitMQ's
// MQTT plugin: publish in order, an outage in the middle of a backlog, and
// a PUBACK withheld until the connection drops.
//
// RabbitMQ 3.10 maps MQTT topics to AMQP routing keys on amq.topic by
// turning '/' into '.', and back again on delivery: a '.' in a topic is a
// level separator there, so "pos/a.b" reaches subscribers as "pos/a/b"
// (and matches "pos/+/+", not "pos/+"). The relay is unaffected; consumers
// see a different topic. Topics here have no '.'.
func TestRabbitMQCompatibility(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	rmq := harness.StartRabbitMQ(t, harness.RabbitMQOptions{})
	sub := startPersistentSubscriber(t, rmq.MQTTAddr, "rabbitmq-consumer", "pos/#")
	p := harness.StartFaultProxy(t, rmq.MQTTAddr)
	ob := openTest(t, Options{})
	r := mqttRelay(t, ob, p.URL(), fastRelay())
	startRelay(t, r)

	dups := brokerCases(t, ob, r, p, sub)
	t.Logf("RabbitMQ %s: 401 events delivered in order, %d duplicates, 0 dead (broker start %s)",
		rmq.Version, dups, rmq.Started.Round(100*time.Millisecond))
}

// TestRabbitMQOversizeNeverAcknowledged: RabbitMQ 3.10 refuses a publish
// over max_message_size (default 128 MiB; lowered to 1 MiB here) without
// closing the MQTT connection. The plugin publishes through an internal
// AMQP channel; the refusal kills that channel ("precondition_failed:
// message size ... is larger than configured max size") and the connection
// goes on answering PINGREQs but never sends another PUBACK — not for the
// refused message, not for those after it, not even for one before it that
// was already routed to subscribers. (A publish refused by topic
// permissions, by contrast, closes the connection, as other brokers do.)
// So the relay cannot see a refusal, only a missing PUBACK: it takes
// AckTimeout per attempt, and the isolation rule still finds the message,
// sends it alone, charges it and parks it as dead after MaxAttempts, while
// the rest is delivered in order.
func TestRabbitMQOversizeNeverAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const brokerMax = 1 << 20
	rmq := harness.StartRabbitMQ(t, harness.RabbitMQOptions{Config: []string{fmt.Sprintf("max_message_size = %d", brokerMax)}})
	sub := startPersistentSubscriber(t, rmq.MQTTAddr, "rabbitmq-consumer", "pos/#")
	big := fmt.Appendf(nil, `{"n":2,"pad":%q}`, strings.Repeat("x", brokerMax+brokerMax/2))

	// What the broker does, seen by a plain client: no PUBACK for the
	// refused publish.
	o := mqtt.NewClientOptions().AddBroker("tcp://" + rmq.MQTTAddr).SetClientID("rabbitmq-probe").
		SetProtocolVersion(4).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
	c := mqtt.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second), "probe connect")
	require.NoError(t, tok.Error())
	pub := c.Publish("probe/big", 1, false, big)
	acked := pub.WaitTimeout(3*time.Second) && pub.Error() == nil
	require.False(t, acked, "a publish over max_message_size acknowledged")
	t.Logf("RabbitMQ %s, oversize publish: no PUBACK after 3 s; connection still open: %v", rmq.Version, c.IsConnectionOpen())
	c.Disconnect(0)

	ob := openTest(t, Options{MaxPayloadBytes: 4 << 20})
	opts := fastRelay()
	opts.MaxAttempts = 2
	startRelay(t, mqttRelay(t, ob, "tcp://"+rmq.MQTTAddr, opts))
	start := time.Now()
	commitOrder(t, ob, "pos/orders", 1)
	require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
		return ob.Enqueue(context.Background(), tx, Message{Topic: "pos/orders", Payload: big})
	}))
	commitOrder(t, ob, "pos/orders", 3)
	eventually(t, 60*time.Second, "the oversize one dead, the others sent", func() bool {
		return countState(t, ob, "dead") == 1 && countState(t, ob, "sent") == 2
	})
	eventually(t, 5*time.Second, "the others delivered", func() bool { return sub.Log.Unique() == 2 })
	state, attempts := rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	require.Equal(t, 2, attempts)
	var lastErr string
	require.NoError(t, ob.DB().QueryRow(`SELECT coalesce(last_error, '') FROM outbox WHERE seq = 2`).Scan(&lastErr))
	require.Contains(t, lastErr, "acknowledgement", "charged for a missing PUBACK")

	got := sub.Log.Snapshot()
	require.Empty(t, got.Disorder, "first deliveries in commit order")
	require.Zero(t, got.DecodeErrors)
	t.Logf("RabbitMQ %s: oversize message dead after %d attempts in %s (AckTimeout %s each), others delivered in order, %d duplicates",
		rmq.Version, attempts, time.Since(start).Round(100*time.Millisecond), opts.AckTimeout, got.Duplicates)
}
