package outbox

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestRelayFailsOverToTheNextBroker: a relay given two addresses (a
// clustered broker's nodes) starts on the one its client id picks, and when
// that node goes away moves to the other, with the same backoff; every
// committed event arrives once at either, first deliveries in commit order,
// none dead, and Stats says which node it is on.
func TestRelayFailsOverToTheNextBroker(t *testing.T) { forProtocols(t, testRelayFailsOver) }

func testRelayFailsOver(t *testing.T, proto MQTTProtocol) {
	nodes := []*harness.Mochi{harness.StartMochi(t, harness.MochiOptions{}), harness.StartMochi(t, harness.MochiOptions{})}
	var recs []*recorder
	for _, m := range nodes {
		rec, err := harness.Record(m, "#", decodeDelivery)
		require.NoError(t, err)
		recs = append(recs, rec)
	}
	ob := openTest(t, Options{})
	pub, err := NewMQTTPublisher(MQTTOptions{Brokers: []string{nodes[0].URL(), nodes[1].URL()}, ClientID: "failover-till",
		ConnectTimeout: 2 * time.Second, WriteTimeout: time.Second, KeepAlive: 2 * time.Second, PingTimeout: time.Second,
		Protocol: proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	startRelay(t, r)
	ctx := context.Background()
	on := func() int {
		st, err := r.Stats(ctx)
		require.NoError(t, err)
		for i, m := range nodes {
			if st.Broker == m.URL() {
				return i
			}
		}
		t.Fatalf("Stats.Broker %q is neither node", st.Broker)
		return -1
	}
	total := func() int { return recs[0].Count() + recs[1].Count() }
	n := 0
	for range 50 {
		n++
		commitOrder(t, ob, "pos/orders", n)
	}
	eventually(t, 10*time.Second, "the first 50 delivered", func() bool { return total() == 50 })
	first := on()
	require.Equal(t, 50, recs[first].Count(), "all on the node it is connected to")

	nodes[first].Stop()
	for range 50 {
		n++
		commitOrder(t, ob, "pos/orders", n)
	}
	eventually(t, 20*time.Second, "the next 50 delivered by the other node", func() bool { return recs[1-first].Count() >= 50 })
	require.Equal(t, 1-first, on(), "Stats says the node it moved to")
	eventually(t, 10*time.Second, "every message marked sent", func() bool { return countState(t, ob, "sent") == n })
	require.Zero(t, countState(t, ob, "dead"))

	// First deliveries across both nodes, in commit order, none missing.
	var all []delivery
	all = append(all, recs[first].All()...)
	all = append(all, recs[1-first].All()...)
	seen := map[int64]bool{}
	var seqs []int64
	for _, d := range all {
		if !seen[d.ev.Sequence] {
			seen[d.ev.Sequence] = true
			seqs = append(seqs, d.ev.Sequence)
		}
	}
	require.Len(t, seqs, n, "every committed event arrived")
	require.True(t, slices.IsSorted(seqs), "first deliveries in commit order: %v", seqs)
}

// TestBrokersOptionChecked: Broker and Brokers are exclusive, every address
// is checked, and TLS files need TLS addresses throughout.
func TestBrokersOptionChecked(t *testing.T) {
	_, err := NewMQTTPublisher(MQTTOptions{Broker: "tcp://a:1", Brokers: []string{"tcp://b:1"}})
	require.ErrorContains(t, err, "not both")
	_, err = NewMQTTPublisher(MQTTOptions{Brokers: []string{"tcp://a:1", "http://b:1"}})
	require.Error(t, err)
	_, err = NewMQTTPublisher(MQTTOptions{})
	require.Error(t, err)
	// Credentials in a URL would be ignored (CONNECT takes the options'),
	// and the broker's refusal retried for ever: refused, never echoed.
	_, err = NewMQTTPublisher(MQTTOptions{Brokers: []string{"tcp://b:1", "tcp://u:secret@a:1"}, ClientID: "x"})
	require.ErrorContains(t, err, "--password-file")
	require.NotContains(t, err.Error(), "secret")
	_, err = NewMQTTPublisher(MQTTOptions{Broker: "tcp://alice@a:1"})
	require.ErrorContains(t, err, "--username")
	_, err = NewMQTTPublisher(MQTTOptions{Broker: "tcp://alice:p%zz@a:1"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "alice", "a URL that does not parse is not echoed either")
	// A fleet spreads: client ids start on different nodes.
	starts := map[string]bool{}
	for _, id := range []string{"till-1", "till-2", "till-3", "till-4", "till-5", "till-6", "till-7", "till-8"} {
		p, err := NewMQTTPublisher(MQTTOptions{Brokers: []string{"tcp://a:1", "tcp://b:1", "tcp://c:1"}, ClientID: id})
		require.NoError(t, err)
		starts[p.Broker()] = true
	}
	require.Len(t, starts, 3, "eight devices start on all three nodes")
}
