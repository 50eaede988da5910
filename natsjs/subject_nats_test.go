package natsjs_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/natsjs"
)

// TestSubjectAsNATSMQTTListener: for the topics nats-server's MQTT listener
// takes (2.9 refuses '.' and spaces), Subject gives the subject the
// listener publishes an MQTT message to, so MQTT and JetStream relays of
// one fleet land on the same subjects.
func TestSubjectAsNATSMQTTListener(t *testing.T) {
	n := harness.StartNATS(t)
	nc, err := nats.Connect("nats://" + n.Addr)
	require.NoError(t, err)
	defer nc.Close()
	subjects := make(chan string, 16)
	_, err = nc.Subscribe(">", func(m *nats.Msg) {
		if !strings.HasPrefix(m.Subject, "$") && !strings.HasPrefix(m.Subject, "_INBOX.") {
			subjects <- m.Subject // not the MQTT listener's own JetStream traffic
		}
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	mp, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: "tcp://" + n.MQTTAddr, ClientID: "subject-test", Protocol: outbox.Protocol311})
	require.NoError(t, err)
	defer mp.Close()
	require.NoError(t, mp.Connect(context.Background()))
	defer mp.Disconnect()
	for _, topic := range []string{"pos/a", "pos", "/pos", "pos/", "pos//a", "/", "//", "a//", "a/b-c_d/é", "pos/a*b/c>d"} {
		want, err := natsjs.Subject(topic)
		require.NoError(t, err)
		tok := mp.Publish(topic, []byte(`{}`))
		select {
		case <-tok.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("%q: no PUBACK", topic)
		}
		require.NoError(t, tok.Error(), topic)
		select {
		case got := <-subjects:
			require.Equal(t, want, got, "topic %q", topic)
		case <-time.After(5 * time.Second):
			t.Fatalf("%q: nothing on NATS", topic)
		}
	}
}
