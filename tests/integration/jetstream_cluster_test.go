package integration

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/natsjs"
)

// TestJetStreamClusterNodeKilled: a relay given the three nodes of a NATS
// cluster drains a backlog, and the application's new commits, into an R3
// stream; the node it is connected to, which leads the stream too, is
// killed with SIGKILL mid-drain. The relay goes on through the other
// nodes once they have elected a new leader, and nothing is lost: the
// stream holds every committed event once, in commit order per subject
// within each priority, though the relay sent again what it had in flight
// when the node died.
func TestJetStreamClusterNodeKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs a three-node NATS cluster")
	}
	ctx := context.Background()
	began := time.Now()
	c := harness.StartNATSCluster(t, 3)
	var urls []string
	for _, n := range c.Nodes {
		urls = append(urls, "nats://"+n.Addr)
	}

	// The stream, R3, created as soon as the cluster's JetStream can
	// place it; the node that leads it is the one to kill.
	setup, err := nats.Connect(strings.Join(urls, ","))
	require.NoError(t, err)
	defer setup.Close()
	sjs, err := jetstream.New(setup)
	require.NoError(t, err)
	var st jetstream.Stream
	harness.Eventually(t, 30*time.Second, "the R3 stream created", func() bool {
		st, err = sjs.CreateStream(ctx, jetstream.StreamConfig{Name: "TILL", Subjects: []string{jsStreamSubjects},
			Storage: jetstream.FileStorage, Replicas: 3, Duplicates: 2 * time.Minute})
		return err == nil
	})
	x := -1
	harness.Eventually(t, 30*time.Second, "the stream has a leader", func() bool {
		info, err := st.Info(ctx)
		if err != nil || info.Cluster == nil {
			return false
		}
		for i, n := range c.Nodes {
			if n.Name == info.Cluster.Leader {
				x = i
			}
		}
		return x >= 0
	})
	setup.Close()

	// The test's own connection, to the nodes that survive.
	var others []string
	for i, u := range urls {
		if i != x {
			others = append(others, u)
		}
	}
	nc, err := nats.Connect(strings.Join(others, ","), nats.MaxReconnects(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err = js.Stream(ctx, "TILL")
	require.NoError(t, err)
	arrivals := countArrivals(t, nc)

	// A backlog, then the application commits on while the relay drains.
	ob, err := outbox.Open(ctx, filepath.Join(t.TempDir(), "till.db"), outbox.Options{Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	w := startJSWriter(t, ob, time.Millisecond, 100, uint64(time.Now().UnixNano()))
	harness.Eventually(t, 30*time.Second, "a backlog committed", func() bool { return w.count() >= 2000 })
	backlog := w.finish()
	w = startJSWriter(t, ob, 4*time.Millisecond, 1, uint64(time.Now().UnixNano()))

	// The relay starts on the stream's leader: the Publisher tries its
	// servers in turn, from the first.
	servers := append(append([]string{}, urls[x:]...), urls[:x]...)
	pub, err := natsjs.New(natsjs.Options{Servers: servers, ConnectTimeout: 2 * time.Second})
	require.NoError(t, err)
	opts := fastRelay()
	opts.LeaseTTL = 30 * time.Second // one relay; a late renewal on a loaded runner must not end its session
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	stop := startRelay(t, r)
	on := func() string {
		s, err := r.Stats(ctx)
		require.NoError(t, err)
		if !s.Connected {
			return ""
		}
		return s.Broker
	}
	harness.Eventually(t, 30*time.Second, "the relay connected to "+c.Nodes[x].Name, func() bool { return on() == urls[x] })
	harness.Eventually(t, 30*time.Second, "a third of the backlog drained", func() bool { return arrivals.n.Load() >= int64(len(backlog)/3) })
	require.Positive(t, countState(t, ob, "pending"), "mid-drain")

	// How many messages the stream holds, as its leader says; -1 while
	// it has none.
	storedNow := func() int64 {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		info, err := st.Info(ctx)
		if err != nil {
			return -1
		}
		return int64(info.State.Msgs)
	}
	before := storedNow()
	require.Positive(t, before, "stored before the kill")
	c.Nodes[x].Kill()
	killed := time.Now()
	harness.Eventually(t, 60*time.Second, "the relay moved to another node", func() bool { b := on(); return b != "" && b != urls[x] })
	moved := time.Since(killed)
	harness.Eventually(t, 60*time.Second, "events stored after the kill", func() bool { return storedNow() >= before+200 })
	flowing := time.Since(killed)
	committed := append(backlog, w.finish()...)
	harness.Eventually(t, 60*time.Second, "the relay drained the outbox", func() bool { return countState(t, ob, "pending") == 0 })
	drained := time.Since(killed)
	s, err := r.Stats(ctx)
	require.NoError(t, err)
	stop()
	require.Zero(t, countState(t, ob, "dead"), "dead")

	var stored []jsStored
	// The new leader may still be settling: read when it answers.
	harness.Eventually(t, 30*time.Second, "the stream readable", func() bool {
		_, err := js.Stream(ctx, "TILL")
		return err == nil || !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout)
	})
	stored = readStream(t, js, "TILL")
	ch := checkStream(stored, committed)
	t.Logf("JetStream cluster: relay and stream leader on %s, killed; relay on %s %s later, events stored again %s, outbox drained %s after the kill; the relay's last error: %s",
		c.Nodes[x].Name, s.Broker, moved.Round(time.Millisecond), flowing.Round(time.Millisecond), drained.Round(time.Millisecond), s.LastError)
	t.Logf("  events committed          %7d  (a backlog of %d, then 250 a second)", len(committed), len(backlog))
	t.Logf("  messages reaching NATS    %7d  (seen on the surviving nodes, re-sends included)", arrivals.n.Load())
	t.Logf("  messages in the stream    %7d  duplicates %d, missing %d, out of order %d", ch.stored, ch.dups, len(ch.missing), len(ch.disorder))
	t.Logf("  time                      %7s  in all", time.Since(began).Round(100*time.Millisecond))
	ch.require(t)
}
