//go:build linux

package outbox

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// ejabberd's mod_mqtt (internal/harness/ejabberd.go says how it is run):
// every login needs a password (any, with anonymous login) or, on the TLS
// listener, a client certificate.

// ejabberdRelay is mqttRelay with a user name and password, which ejabberd
// requires.
func ejabberdRelay(t *testing.T, ob *Outbox, brokerURL string, opts RelayOptions) *Relay {
	t.Helper()
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: brokerURL, ClientID: "relay-" + NewID()[24:], Username: "till-1", Password: harness.EjabberdPassword,
		ConnectTimeout: 2 * time.Second, WriteTimeout: time.Second, KeepAlive: 2 * time.Second, PingTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	return r
}

// startEjabberdSubscriber is startPersistentSubscriber with a user name
// and password.
func startEjabberdSubscriber(t *testing.T, addr, clientID, filter string) *harness.Subscriber {
	t.Helper()
	return harness.StartSubscriber(t, addr, harness.SubscriberOptions{ClientID: clientID, Filter: filter, Username: clientID, Password: harness.EjabberdPassword}, eventIDSeq)
}

// TestEjabberdCompatibility runs the relay's core cases against ejabberd's
// MQTT broker (mod_mqtt): publish in order to a persistent subscriber, an
// outage in the middle of a backlog, and a PUBACK withheld until the
// connection drops.
//
// mod_mqtt keeps a CleanSession=false session (MQTT 3.1.1) for
// session_expiry after its client goes (default 5 minutes), in RAM: a node
// restart loses it. Its queue holds max_queue messages (default 5000); one
// more clears the whole queue and ends the session (mod_mqtt_session.erl).
// It sends a subscriber one QoS 1 message at a time, the next after the
// PUBACK, and acknowledges a publisher's QoS 1 message once it has handed
// it to the subscribers' sessions: here the relay had all 300 PUBACKs when
// the subscriber had about 30.
func TestEjabberdCompatibility(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	e := harness.StartEjabberd(t, harness.EjabberdOptions{})
	sub := startEjabberdSubscriber(t, e.MQTTAddr, "consumer", "pos/#")
	p := harness.StartFaultProxy(t, e.MQTTAddr)
	ob := openTest(t, Options{})
	r := ejabberdRelay(t, ob, p.URL(), fastRelay())
	startRelay(t, r)

	dups := brokerCases(t, ob, r, p, sub)
	require.Zero(t, sub.SessionsLost(), "the subscriber's session survived")
	t.Logf("ejabberd %s: 401 events delivered in order, %d duplicates, 0 dead (broker start %s)",
		e.Version, dups, e.Started.Round(100*time.Millisecond))
}

// TestEjabberdDeniedPublishAcknowledged: a publish its access rules refuse
// (access_publish) is acknowledged and dropped, and the connection stays
// up. mod_mqtt answers with a PUBACK whose reason code says "topic name
// invalid", but an MQTT 3.1.1 PUBACK has no reason code: the relay cannot
// tell it from a delivery, so the row is marked sent — as with Mosquitto's
// ACL, and unlike RabbitMQ's topic permissions, which close the
// connection. Unlike Mosquitto, ejabberd does not log it at its default
// level (info). The defence is at the device: topics built from one prefix
// the broker allows.
func TestEjabberdDeniedPublishAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	e := harness.StartEjabberd(t, harness.EjabberdOptions{})
	sub := startEjabberdSubscriber(t, e.MQTTAddr, "consumer", "pos/#")
	ob := openTest(t, Options{})
	r := ejabberdRelay(t, ob, "tcp://"+e.MQTTAddr, fastRelay())
	startRelay(t, r)

	commitOrder(t, ob, "pos/orders", 1)
	commitOrder(t, ob, "other/orders", 2) // outside the allowed pos/#
	commitOrder(t, ob, "pos/orders", 3)
	eventually(t, 10*time.Second, "all three acknowledged", func() bool { return countState(t, ob, "sent") == 3 })
	eventually(t, 5*time.Second, "the allowed two delivered", func() bool { return sub.Log.Unique() == 2 })
	s, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.True(t, s.Connected, "the connection was not dropped")
	require.Zero(t, countState(t, ob, "dead"))
	// A fence: mod_mqtt routes one connection's publishes in order, so once
	// a later one has arrived the denied one is not on its way.
	commitOrder(t, ob, "pos/orders", 4)
	eventually(t, 5*time.Second, "the fence delivered", func() bool { return sub.Log.Unique() == 3 })
	var deniedID string
	require.NoError(t, ob.DB().QueryRow(`SELECT id FROM outbox WHERE seq = 2`).Scan(&deniedID))
	require.False(t, sub.Log.Has(deniedID), "the denied publish was dropped")
	log, err := os.ReadFile(e.LogFile)
	require.NoError(t, err)
	require.NotContains(t, string(log), "other/orders", "not in the log")
	require.NotContains(t, string(log), "forbidden", "not in the log")
	t.Logf("ejabberd %s: a publish outside access_publish acknowledged, dropped, connection kept", e.Version)
}
