package integration

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// RabbitMQ 3.10 (the Debian package) with its MQTT plugin. One node serves
// every case (a start is ~10 s): a plain listener, and a TLS listener that
// requires a client certificate from the fleet CA (ssl_options verify_peer,
// fail_if_no_peer_cert); its alert says which refusal it is, "certificate
// required" for none (a certificate from a differently named CA is not
// sent), "unknown certificate authority" for one it cannot verify.
//
// It maps MQTT topics to AMQP routing keys on amq.topic by turning '/' into
// '.', and back again on delivery: a '.' in a topic is a level separator
// there, so "pos/a.b" reaches subscribers as "pos/a/b" (and matches
// "pos/+/+", not "pos/+"). The relay is unaffected; consumers see a
// different topic. A publish refused by topic permissions closes the
// connection (not set up here); one over max_message_size is never
// acknowledged (its own case).
var rabbitMQKind = brokerKind{
	name:  "RabbitMQ",
	start: startRabbitMQSet,
	extra: []brokerCase{{"oversize never acknowledged", oversizeNeverAcknowledged}},
}

// rabbitMaxMessage is the node's max_message_size (default 128 MiB).
const rabbitMaxMessage = 1 << 20

func TestRabbitMQ(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs real brokers")
	}
	runBrokerTests(t, rabbitMQKind)
}

func startRabbitMQSet(t *testing.T, pki *harness.BrokerTLS) *brokerSet {
	r := harness.StartRabbitMQ(t, harness.RabbitMQOptions{TLS: &pki.Server,
		Config: []string{fmt.Sprintf("max_message_size = %d", rabbitMaxMessage)}})
	tg := &target{name: "RabbitMQ " + r.Version, addr: r.MQTTAddr, tlsAddr: r.MQTTTLSAddr}
	return &brokerSet{plain: tg, tls: tg}
}

// oversizeNeverAcknowledged: RabbitMQ 3.10 refuses a publish over
// max_message_size without closing the MQTT connection. The plugin
// publishes through an internal AMQP channel; the refusal kills that
// channel ("precondition_failed: message size ... is larger than configured
// max size") and the connection goes on answering PINGREQs but never sends
// another PUBACK — not for the refused message, not for those after it, not
// even for one before it that was already routed to subscribers. So the
// relay cannot see a refusal, only a missing PUBACK: it takes AckTimeout per
// attempt, and the isolation rule still finds the message, sends it alone,
// charges it and parks it as dead after MaxAttempts, while the rest is
// delivered in order.
func oversizeNeverAcknowledged(t *testing.T, _ brokerKind, set *brokerSet) {
	tg := set.plain
	sub := tg.subscribe(t, "oversize", "pos/#")
	big := fmt.Appendf(nil, `{"n":2,"pad":%q}`, strings.Repeat("x", rabbitMaxMessage+rabbitMaxMessage/2))

	// What the broker does, seen by a plain client: no PUBACK for the
	// refused publish.
	o := mqtt.NewClientOptions().AddBroker("tcp://" + tg.addr).SetClientID("rabbitmq-probe").
		SetProtocolVersion(4).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
	c := mqtt.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second), "probe connect")
	require.NoError(t, tok.Error())
	pub := c.Publish("probe/big", 1, false, big)
	acked := pub.WaitTimeout(3*time.Second) && pub.Error() == nil
	require.False(t, acked, "a publish over max_message_size acknowledged")
	t.Logf("%s, oversize publish: no PUBACK after 3 s; connection still open: %v", tg.name, c.IsConnectionOpen())
	c.Disconnect(0)

	ob := openTest(t, outbox.Options{MaxPayloadBytes: 4 << 20})
	opts := fastRelay()
	opts.Retry = fastRetry(2)
	startRelay(t, newRelayOn(t, ob, "tcp://"+tg.addr, tg.login, "", opts, tg.proto))
	start := time.Now()
	commitOrder(t, ob, "pos/orders", 1)
	require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
		return ob.Enqueue(context.Background(), tx, outbox.Message{Topic: "pos/orders", Payload: big})
	}))
	commitOrder(t, ob, "pos/orders", 3)
	harness.Eventually(t, 60*time.Second, "the oversize one dead, the others sent", func() bool {
		return countState(t, ob, "dead") == 1 && countState(t, ob, "sent") == 2
	})
	harness.Eventually(t, 5*time.Second, "the others delivered", func() bool { return sub.Unique() == 2 })
	state, attempts := rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	require.Equal(t, 2, attempts)
	var lastErr string
	require.NoError(t, ob.DB().QueryRow(`SELECT coalesce(last_error, '') FROM outbox WHERE seq = 2`).Scan(&lastErr))
	require.Contains(t, lastErr, "acknowledgement", "charged for a missing PUBACK")

	got := sub.Snapshot()
	require.Empty(t, got.Disorder, "first deliveries in commit order")
	require.Zero(t, got.DecodeErrors)
	t.Logf("%s: oversize message dead after %d attempts in %s (AckTimeout %s each), others delivered in order, %d duplicates",
		tg.name, attempts, time.Since(start).Round(100*time.Millisecond), opts.AckTimeout, got.Duplicates)
}
