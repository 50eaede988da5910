package integration

import (
	"context"
	"database/sql"
	"hash/fnv"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/consumer"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestNATSClusterFailover: a relay given the three nodes of a NATS cluster
// (JetStream clustered, an MQTT listener on each) drains a writer's
// commits while the node it is connected to is killed, or paused (SIGSTOP:
// its sockets open and silent, as a hung machine's). The relay moves to the
// next node; every committed event reaches a subscriber on a surviving node
// (another than the relay's first), in commit order, none dead,
// duplicates only from the messages in flight when the node went. A
// consumer (Subscriber and Inbox) given the three nodes, on the relay's
// node, moves too and applies every event once (its session lives in the
// cluster's JetStream, not on the node); when the node hangs, see below.
func TestNATSClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs a three-node NATS cluster")
	}
	for _, fault := range []string{"kill", "pause"} {
		t.Run(fault, func(t *testing.T) { testNATSClusterFailover(t, fault) })
	}
}

func testNATSClusterFailover(t *testing.T, fault string) {
	ctx := context.Background()
	c := harness.StartNATSCluster(t, 3)
	var urls []string
	for _, n := range c.Nodes {
		urls = append(urls, "tcp://"+n.MQTTAddr)
	}
	ob := openTest(t, outbox.Options{})
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Brokers: urls, ClientID: "cluster-till",
		ConnectTimeout: 2 * time.Second, WriteTimeout: time.Second, KeepAlive: 2 * time.Second, PingTimeout: time.Second,
		Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	opts := fastRelay()
	opts.LeaseTTL = 30 * time.Second // one relay; a late renewal on a loaded runner must not end its session
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	on := func() int {
		st, err := r.Stats(ctx)
		require.NoError(t, err)
		if !st.Connected {
			return -1
		}
		for i, u := range urls {
			if st.Broker == u {
				return i
			}
		}
		return -1
	}
	x := -1
	require.True(t, harness.WaitFor(30*time.Second, func() bool { x = on(); return x >= 0 }), "the relay connected to a node")
	// The subscriber is on another node than the relay's first: the
	// events cross the cluster before the fault. (The relay tries the
	// next node first; while JetStream elects new leaders a node may
	// refuse MQTT sessions, and it moves on.)
	y := (x + 2) % 3
	sub := harness.StartSubscriber(t, c.Nodes[y].MQTTAddr, harness.SubscriberOptions{ClientID: "cluster-consumer", Filter: "orders/#"}, eventIDSeq)
	t.Logf("relay on %s, subscriber on %s; fault: %s", c.Nodes[x].Name, c.Nodes[y].Name, fault)

	inbox := startClusterConsumer(t, urls, x)

	var committed atomic.Int64
	stopWriter := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // about 200 commits a second until told to stop
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-stopWriter:
				return
			case <-tick.C:
			}
			commitOrder(t, ob, "orders/till", n)
			committed.Add(1)
		}
	}()
	require.True(t, harness.WaitFor(30*time.Second, func() bool { return sub.Log.Unique() >= 100 }), "events flowing before the fault")
	before := sub.Log.Unique()
	switch fault {
	case "kill":
		c.Nodes[x].Kill()
	case "pause":
		c.Nodes[x].Pause()
		t.Cleanup(c.Nodes[x].Resume) // before the node's own cleanup stops it
	}
	faultAt := time.Now()
	moved := -1
	require.True(t, harness.WaitFor(60*time.Second, func() bool { moved = on(); return moved >= 0 && moved != x }), "the relay moved to another node")
	t.Logf("on %s %s after the fault", c.Nodes[moved].Name, time.Since(faultAt).Round(time.Millisecond))
	require.True(t, harness.WaitFor(60*time.Second, func() bool { return sub.Log.Unique() >= before+100 }), "events flowing after the fault")
	close(stopWriter)
	wg.Wait()
	total := int(committed.Load())
	require.True(t, harness.WaitFor(60*time.Second, func() bool { return sub.Log.Unique() == total }),
		"every committed event delivered: %d of %d", sub.Log.Unique(), total)
	rec := sub.Log.Snapshot()
	require.Zero(t, rec.DecodeErrors)
	require.Empty(t, rec.Disorder, "first deliveries in commit order")
	require.Zero(t, countState(t, ob, "dead"), "none dead")
	require.True(t, harness.WaitFor(10*time.Second, func() bool { return countState(t, ob, "pending") == 0 }), "all marked sent")
	// One lost connection (and the failed attempts on the dead node
	// after it, which carry nothing): at most the window goes again.
	require.LessOrEqual(t, rec.Duplicates, 2*64, "duplicates only from what was in flight")
	// With the consumer's node paused, NATS 2.9.10 lost one QoS 1 message
	// for the consumer's session in about half the runs here: published
	// after the fault through a surviving node, never delivered, also
	// after the node was resumed (ack_wait 3 s). With the node killed it
	// lost 2 of 1,310 once in CI (2026-12-01; the harness's subscriber, on
	// a surviving node, had every event; the consumer's counters were not
	// logged then, and are now). So the consumer's losses are reported, not
	// asserted; that it applies each event once is.
	wait := 60 * time.Second
	if fault == "pause" {
		wait = 20 * time.Second
	}
	if !harness.WaitFor(wait, func() bool { return inbox.applied() == total }) {
		t.Logf("NATS lost %d of %d events for the consumer whose node failed (%s); consumer stats %+v", total-inbox.applied(), total, fault, inbox.s.Stats())
	}
	require.Equal(t, inbox.applied(), inbox.distinct(), "each applied once")
	cs := inbox.s.Stats()
	require.NotEqual(t, urls[x], cs.Broker, "the consumer moved off the failed node")
	t.Logf("consumer: applied %d, duplicates skipped %d, now on %s", cs.Applied, cs.Duplicates, cs.Broker)
	t.Logf("committed %d, delivered %d (duplicates %d), subscriber reconnects %d", total, rec.Deliveries, rec.Duplicates, sub.Reconnects())
}

type clusterConsumer struct {
	t  *testing.T
	db *sql.DB
	s  *consumer.Subscriber
}

// startClusterConsumer runs a Subscriber given every node, whose client id
// makes it start on node x, applying through an Inbox.
func startClusterConsumer(t *testing.T, urls []string, x int) *clusterConsumer {
	const id = "cluster-inbox"
	// The Subscriber's first address is FNV-1a of the client id modulo the
	// number of addresses; order the list so that this is node x.
	h := fnv.New32a()
	h.Write([]byte(id))
	k := int(h.Sum32() % uint32(len(urls)))
	brokers := make([]string, len(urls))
	for i := range urls {
		brokers[(k+i)%len(urls)] = urls[(x+i)%len(urls)]
	}
	db, err := outbox.OpenDB(filepath.Join(t.TempDir(), "consumer.db"), outbox.DBOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	_, err = db.Exec(`CREATE TABLE applied (id TEXT NOT NULL)`)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	in, err := consumer.NewInbox(ctx, db, consumer.InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	s, err := consumer.NewSubscriber(in, func(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO applied (id) VALUES (?)`, ev.ID)
		return err
	}, consumer.SubscriberOptions{Brokers: brokers, ClientID: id, Topics: []string{"orders/#"},
		Reconnect: outbox.Backoff{Initial: 50 * time.Millisecond, Max: time.Second},
		KeepAlive: 2 * time.Second, PingTimeout: time.Second, ConnectTimeout: 2 * time.Second, Logger: testLogger()})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.True(t, harness.WaitFor(30*time.Second, func() bool { st := s.Stats(); return st.Connected && st.Broker == urls[x] }),
		"the consumer connected to the relay's node: %+v", s.Stats())
	return &clusterConsumer{t: t, db: db, s: s}
}

func (c *clusterConsumer) applied() int  { return c.count(`SELECT count(*) FROM applied`) }
func (c *clusterConsumer) distinct() int { return c.count(`SELECT count(DISTINCT id) FROM applied`) }

func (c *clusterConsumer) count(q string) int {
	var n int
	require.NoError(c.t, c.db.QueryRow(q).Scan(&n))
	return n
}
