package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestNATSCompatibility runs the relay's core cases against NATS Server's
// MQTT listener (JetStream): publish in order, an outage in the middle of a
// backlog, and a PUBACK withheld until the connection drops.
func TestNATSCompatibility(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	n := harness.StartNATS(t)
	sub := startPersistentSubscriber(t, n.MQTTAddr, "nats-consumer", "pos/#")
	p := harness.StartFaultProxy(t, n.MQTTAddr)
	ob := openTest(t, Options{})
	r := mqttRelay(t, ob, p.URL(), fastRelay())
	startRelay(t, r)

	dups := brokerCases(t, ob, r, p, sub)
	t.Logf("NATS: 401 events delivered in order, %d duplicates, 0 dead", dups)
}

// TestNATSRefusesSomeTopics: NATS maps MQTT topics to subjects and refuses
// a publish to a topic with '.' or ' ' by closing the connection — the way
// an MQTT 3.1.1 broker refuses. The isolation rule parks such a message as
// dead after MaxAttempts, and the rest flows.
func TestNATSRefusesSomeTopics(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	n := harness.StartNATS(t)
	sub := startPersistentSubscriber(t, n.MQTTAddr, "nats-consumer", "pos/#")
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.MaxAttempts = 2
	startRelay(t, mqttRelay(t, ob, "tcp://"+n.MQTTAddr, opts))
	commitOrder(t, ob, "pos/a.b", 1)
	commitOrder(t, ob, "pos/a b", 2)
	commitOrder(t, ob, "pos/ok", 3)
	eventually(t, 20*time.Second, "two dead, one sent", func() bool {
		return countState(t, ob, "dead") == 2 && countState(t, ob, "sent") == 1
	})
	eventually(t, 5*time.Second, "the valid one delivered", func() bool { return sub.Log.Unique() == 1 })
	for _, seq := range []int64{1, 2} {
		state, attempts := rowState(t, ob, seq)
		require.Equal(t, "dead", state)
		require.Equal(t, 2, attempts)
	}
}
