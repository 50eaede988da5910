package consumer

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/mqtt"
)

// TestSubscriberFailsOverToTheNextBroker: a Subscriber given two addresses
// starts on the node its client id picks, and when that node goes away
// moves to the other and applies what is published there; Stats says
// which node it is on.
func TestSubscriberFailsOverToTheNextBroker(t *testing.T) {
	forProtocols(t, func(t *testing.T, proto outbox.MQTTProtocol) {
		nodes := []*harness.Mochi{harness.StartMochi(t, harness.MochiOptions{}), harness.StartMochi(t, harness.MochiOptions{})}
		urls := []string{nodes[0].URL(), nodes[1].URL()}
		const id = "consumer-failover"
		first := mqtt.FirstBroker(id, len(urls))
		db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
		in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
		require.NoError(t, err)
		s, _ := runSubscriber(t, in, recordApplied, SubscriberOptions{Brokers: urls, ClientID: id, Topics: []string{"pos/#"}, Protocol: proto})
		eventually(t, 10*time.Second, "connected", func() bool { return s.Stats().Connected })
		require.Equal(t, urls[first], s.Stats().Broker)

		// One till on each node (the nodes are not a cluster here: what is
		// published to one reaches only its own subscribers).
		tills := make([]*outbox.Outbox, 2)
		for i := range tills {
			tills[i] = openTest(t, outbox.Options{})
			startRelay(t, mqttRelayOn(t, tills[i], urls[(first+i)%2], fastRelay(), proto))
		}
		for i := range 10 {
			commitOrder(t, tills[0], "pos/orders", i)
		}
		eventually(t, 10*time.Second, "the first node's events applied", func() bool { return appliedCount(t, db) == 10 })

		nodes[first].Stop()
		// The consumer's session on the other node begins when it
		// subscribes there: what that node had before is not for it.
		eventually(t, 20*time.Second, "subscribed on the other node", func() bool {
			st := s.Stats()
			return st.Connected && st.Broker == urls[1-first]
		})
		for i := range 10 {
			commitOrder(t, tills[1], "pos/orders", i)
		}
		eventually(t, 20*time.Second, "the other node's events applied", func() bool { return appliedCount(t, db) == 20 })
	})
}

// TestSubscriberBrokersOptionChecked: Broker and Brokers are checked as for
// the publisher, before any connection.
func TestSubscriberBrokersOptionChecked(t *testing.T) {
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	opts := func(broker string, brokers ...string) SubscriberOptions {
		return SubscriberOptions{Broker: broker, Brokers: brokers, ClientID: "c", Topics: []string{"pos/#"}}
	}
	_, err = NewSubscriber(in, recordApplied, opts("tcp://a:1", "tcp://b:1"))
	require.ErrorContains(t, err, "not both")
	_, err = NewSubscriber(in, recordApplied, opts("", "tcp://a:1", "http://b:1"))
	require.Error(t, err)
	_, err = NewSubscriber(in, recordApplied, opts(""))
	require.Error(t, err)
	_, err = NewSubscriber(in, recordApplied, opts("", "tcp://b:1", "tcp://u:secret@a:1"))
	require.ErrorContains(t, err, "--password-file")
	require.NotContains(t, err.Error(), "secret")
}
