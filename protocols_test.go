package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testProtocols are the MQTT versions the relay tests that use the
// MQTTPublisher run on.
var testProtocols = []MQTTProtocol{Protocol5, Protocol311}

// forProtocols runs test once per MQTT version, as a subtest named for it.
func forProtocols(t *testing.T, test func(t *testing.T, proto MQTTProtocol)) {
	t.Helper()
	for _, proto := range testProtocols {
		t.Run("mqtt "+proto.String(), func(t *testing.T) { test(t, proto) })
	}
}

// testPublisher is the publisher mqttRelay uses, speaking proto.
func testPublisher(t testing.TB, brokerURL string, proto MQTTProtocol) *MQTTPublisher {
	t.Helper()
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: brokerURL, ClientID: "relay-" + NewID()[24:], ConnectTimeout: 2 * time.Second,
		WriteTimeout: time.Second, KeepAlive: 2 * time.Second, PingTimeout: time.Second, Protocol: proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	return pub
}

// mqttRelayOn is mqttRelay speaking proto.
func mqttRelayOn(t testing.TB, ob *Outbox, brokerURL string, opts RelayOptions, proto MQTTProtocol) *Relay {
	t.Helper()
	r, err := ob.NewRelay(testPublisher(t, brokerURL, proto), opts)
	require.NoError(t, err)
	return r
}
