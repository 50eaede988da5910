package integration

import (
	"fmt"
	"testing"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// NATS Server 2.9 with JetStream (the Debian package), its MQTT listener.
// It needs server_name, JetStream and an mqtt {} block. It maps MQTT topics
// to subjects and refuses a publish to a topic with '.' or ' ' by closing
// the connection. It has one MQTT listener, so with TLS on (verify: true)
// that listener is TLS-only; it sends "bad certificate" for both a missing
// and an untrusted client certificate, and only its log tells them apart.
var natsKind = brokerKind{
	name:   "NATS",
	traits: traits{RefusesDotInTopics: true, TLSOnly: true},
	start:  startNATSSet,
}

func TestNATS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs real brokers")
	}
	runBrokerTests(t, natsKind)
}

func startNATSSet(t *testing.T, pki *harness.BrokerTLS) *brokerSet {
	n := harness.StartNATS(t)
	s := harness.StartNATS(t, fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }",
		pki.Server.CertFile, pki.Server.KeyFile, pki.Server.CAFile))
	return &brokerSet{
		plain: &target{name: "NATS", addr: n.MQTTAddr},
		tls:   &target{name: "NATS", tlsAddr: s.MQTTAddr},
	}
}
