//go:build linux

package outbox

import (
	"testing"
	"time"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestRabbitMQTLS runs the relay against RabbitMQ's MQTT plugin with a TLS
// listener (mqtt.listeners.ssl) that requires a client certificate from the
// fleet CA (ssl_options verify_peer, fail_if_no_peer_cert). The node keeps
// its plain listener for the test's subscriber. The right setup delivers; a
// wrong CA, no client certificate and an untrusted one (brokerTLS.cases)
// each give one clear error, and the message stays pending and uncharged.
// RabbitMQ's alert says which: "certificate required" for none (a
// certificate from a differently named CA is not sent), "unknown
// certificate authority" for one it cannot verify.
// One node serves every case (a start is ~10 s).
func TestRabbitMQTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	b := harness.NewBrokerTLS(t)
	rmq := harness.StartRabbitMQ(t, harness.RabbitMQOptions{TLS: &b.Server})
	sub := startPersistentSubscriber(t, rmq.MQTTAddr, "rabbitmq-consumer", "pos/#")
	runBrokerTLSCases(t, "RabbitMQ "+rmq.Version, rmq.MQTTTLSAddr, "", brokerTLSCases(b))
	eventually(t, 10*time.Second, "the subscriber has it", func() bool { return sub.Log.Unique() == 1 })
	if n := sub.Log.Snapshot().DecodeErrors; n != 0 {
		t.Errorf("%d undecodable deliveries", n)
	}
}
