package consumer

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// jsStream is a NATS server with a stream "EVENTS" on pos.>, and a
// connection to publish into it.
type jsStream struct {
	url string
	js  jetstream.JetStream
}

func startJetStream(t *testing.T) *jsStream {
	t.Helper()
	n := harness.StartNATS(t)
	nc, err := nats.Connect("nats://" + n.Addr)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"pos.>"}, Duplicates: time.Minute})
	require.NoError(t, err)
	return &jsStream{url: "nats://" + n.Addr, js: js}
}

// jsEvent is event seq of /stores/1 as a CloudEvents JSON document.
func jsEvent(id string, seq int) []byte {
	return fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"/stores/1","type":"pos.sale","sequence":"%d","data":{"n":%d}}`, id, seq, seq)
}

// publish puts a message into the stream with msgID as its Nats-Msg-Id.
func (s *jsStream) publish(t *testing.T, subject, msgID string, data []byte, h nats.Header) {
	t.Helper()
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	for k, v := range h {
		m.Header[k] = v
	}
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.js.PublishMsg(ctx, m)
	require.NoError(t, err)
}

func runJetStreamConsumer(t *testing.T, in *Inbox, h Handler, opts JetStreamConsumerOptions) (*JetStreamConsumer, func()) {
	t.Helper()
	opts.Reconnect = outbox.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	opts.HandlerBackoff = outbox.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}
	opts.Logger, opts.pullWait = testLogger(), time.Second
	if opts.Stream == "" {
		opts.Stream = "EVENTS"
	}
	if opts.Durable == "" {
		opts.Durable = "apply"
	}
	c, err := NewJetStreamConsumer(in, h, opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return c, stop
}

// appliedSeqs are the sequences in the applied table, in the order applied.
func appliedSeqs(t *testing.T, db *sql.DB) []int64 {
	t.Helper()
	rows, err := db.Query(`SELECT seq FROM applied ORDER BY rowid`)
	require.NoError(t, err)
	defer rows.Close()
	var seqs []int64
	for rows.Next() {
		var s int64
		require.NoError(t, rows.Scan(&s))
		seqs = append(seqs, s)
	}
	require.NoError(t, rows.Err())
	return seqs
}

func oneToN(n int) []int64 {
	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i + 1)
	}
	return want
}

// TestJetStreamConsumerAppliesOnceInOrder: one member applies every event
// of the stream once and in the stream's order, through a handler that
// fails twice on one event (held and tried again, the rest waiting), with
// re-sends the stream deduplicated (same Nats-Msg-Id) and re-sends it
// could not (a new Nats-Msg-Id, as past the duplicate window), which the
// Inbox drops, and events in binary mode (ce- headers) among structured
// ones.
func TestJetStreamConsumerAppliesOnceInOrder(t *testing.T) {
	const n = 120
	s := startJetStream(t)
	db := consumerDB(t, t.TempDir()+"/consumer.db")
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	var fails atomic.Int32
	h := func(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
		if ev.Sequence == 50 && fails.Add(1) <= 2 {
			return errors.New("handler: not yet")
		}
		return recordApplied(ctx, tx, ev)
	}
	ids := make([]string, n+1)
	for seq := 1; seq <= n; seq++ {
		ids[seq] = outbox.NewID()
		if seq%10 == 0 {
			s.publish(t, "pos.stores.1", ids[seq], []byte(fmt.Sprintf(`{"n":%d}`, seq)), nats.Header{
				"ce-specversion": {"1.0"}, "ce-id": {ids[seq]}, "ce-source": {"%2Fstores%2F1"}, "ce-type": {"pos.sale"},
				"ce-sequence": {fmt.Sprint(seq)}, "Content-Type": {"application/json"},
			})
		} else {
			s.publish(t, "pos.stores.1", ids[seq], jsEvent(ids[seq], seq), nil)
		}
		if seq%7 == 0 {
			s.publish(t, "pos.stores.1", ids[seq], jsEvent(ids[seq], seq), nil) // deduplicated by the stream
		}
		if seq%11 == 0 {
			s.publish(t, "pos.stores.1", "late-"+ids[seq], jsEvent(ids[seq], seq), nil) // by the Inbox
		}
	}
	c, _ := runJetStreamConsumer(t, in, h, JetStreamConsumerOptions{Servers: []string{s.url}, Batch: 16})
	eventually(t, 15*time.Second, "every event applied", func() bool {
		st := c.Stats()
		return st.Applied == n && st.Duplicates == n/11
	})
	require.Equal(t, oneToN(n), appliedSeqs(t, db), "every event once, in order")
	var data []byte
	require.NoError(t, db.QueryRow(`SELECT data FROM applied WHERE seq = 30`).Scan(&data))
	require.Equal(t, `{"n":30}`, string(data), "binary mode's data is the body")
	var src string
	require.NoError(t, db.QueryRow(`SELECT source FROM applied WHERE seq = 30`).Scan(&src))
	require.Equal(t, "/stores/1", src, "ce- headers are percent-decoded")
	st := c.Stats()
	require.EqualValues(t, 2, st.HandlerErrors)
	require.True(t, st.Connected)
	// Everything was acknowledged: nothing is left for the consumer.
	eventually(t, 5*time.Second, "nothing pending", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		info, err := s.js.Consumer(ctx, "EVENTS", "apply")
		if err != nil {
			return false
		}
		ci, err := info.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0
	})
}

// TestJetStreamConsumerQuarantinesMalformed: a message that is not an
// event is quarantined and acknowledged, and the events behind it are
// applied.
func TestJetStreamConsumerQuarantinesMalformed(t *testing.T) {
	s := startJetStream(t)
	db := consumerDB(t, t.TempDir()+"/consumer.db")
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	s.publish(t, "pos.a", "1", jsEvent(outbox.NewID(), 1), nil)
	s.publish(t, "pos.a", "bad-json", []byte("not json"), nil)
	s.publish(t, "pos.a", "bad-header", []byte("x"), nats.Header{"ce-specversion": {"1.0"}, "ce-id": {"%zz"}, "ce-source": {"s"}, "ce-type": {"t"}})
	s.publish(t, "pos.a", "2", jsEvent(outbox.NewID(), 2), nil)
	c, _ := runJetStreamConsumer(t, in, recordApplied, JetStreamConsumerOptions{Servers: []string{s.url}})
	eventually(t, 10*time.Second, "settled", func() bool { st := c.Stats(); return st.Applied == 2 && st.Quarantined == 2 })
	require.Equal(t, oneToN(2), appliedSeqs(t, db))
	var k int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM inbox_quarantine WHERE topic = 'pos.a'`).Scan(&k))
	require.Equal(t, 2, k)
}

// TestJetStreamConsumerMemberDies: three members on one durable consumer,
// each with an Inbox on one shared database; one dies (stops at once with
// nothing more said to the server) after committing an event and before
// acknowledging it, holding the rest of its pull. Every event is applied
// exactly once, by the inbox table, within AckWait and a few seconds of
// the death: the survivors take what it held.
func TestJetStreamConsumerMemberDies(t *testing.T) {
	forDialects(t, func(t *testing.T, d *dialectDB) {
		const n, ackWait = 300, 2 * time.Second
		s := startJetStream(t)
		var died atomic.Bool
		var diedAt atomic.Int64
		// All are in the stream first, so that each pull is a full batch
		// and the member that dies holds messages it has not applied.
		for seq := 1; seq <= n; seq++ {
			id := outbox.NewID()
			s.publish(t, "pos.stores."+fmt.Sprint(seq%4), id, jsEvent(id, seq), nil)
		}
		var members []*JetStreamConsumer
		for i := range 3 {
			db := d.open(t)
			in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger(), Dialect: d.dialect})
			require.NoError(t, err)
			opts := JetStreamConsumerOptions{Servers: []string{s.url}, AckWait: ackWait, Batch: 8}
			if i == 0 {
				var seen int
				opts.crashBefore = func(outbox.Event) bool {
					if seen++; seen == 5 {
						diedAt.Store(time.Now().UnixNano())
						died.Store(true)
						return true
					}
					return false
				}
			}
			c, _ := runJetStreamConsumer(t, in, d.record, opts)
			members = append(members, c)
		}
		eventually(t, 10*time.Second, "a member died", died.Load)
		db := d.open(t)
		eventually(t, ackWait+5*time.Second, "every event applied", func() bool { return d.count(t, db) >= n })
		took := time.Since(time.Unix(0, diedAt.Load()))
		rows, err := db.Query(`SELECT seq FROM applied`)
		require.NoError(t, err)
		var got []int64
		for rows.Next() {
			var seq int64
			require.NoError(t, rows.Scan(&seq))
			got = append(got, seq)
		}
		require.NoError(t, rows.Err())
		rows.Close()
		slices.Sort(got)
		require.Equal(t, oneToN(n), got, "every event exactly once")
		var dups int64
		for _, m := range members[1:] {
			dups += m.Stats().Duplicates
		}
		require.GreaterOrEqual(t, dups, int64(1), "the event the dead member committed came again and was recognised")
		t.Logf("all %d applied %v after the death (AckWait %v); per member: %d, %d, %d", n, took.Round(time.Millisecond), ackWait,
			members[0].Stats().Applied, members[1].Stats().Applied, members[2].Stats().Applied)
	})
}

func TestNewJetStreamConsumerChecksOptions(t *testing.T) {
	db := consumerDB(t, t.TempDir()+"/consumer.db")
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	for name, o := range map[string]JetStreamConsumerOptions{
		"no servers":  {Stream: "S", Durable: "d"},
		"no stream":   {Servers: []string{"nats://x:4222"}, Durable: "d"},
		"no durable":  {Servers: []string{"nats://x:4222"}, Stream: "S"},
		"dot in name": {Servers: []string{"nats://x:4222"}, Stream: "S", Durable: "a.b"},
		"joined URLs": {Servers: []string{"nats://x:4222,nats://y:4222"}, Stream: "S", Durable: "d"},
		"tls twice":   {Servers: []string{"nats://x:4222"}, Stream: "S", Durable: "d", TLSFiles: &outbox.TLSFiles{}, TLSConfig: &tls.Config{}},
	} {
		_, err := NewJetStreamConsumer(in, recordApplied, o)
		require.Error(t, err, name)
	}
	_, err = NewJetStreamConsumer(in, recordApplied, JetStreamConsumerOptions{Servers: []string{"nats://x:4222"}, Stream: "S", Durable: "d"})
	require.NoError(t, err)
}

// TestJetStreamConsumerReconnects: the connection is cut and the server
// unreachable for a while; the consumer connects again, binds to the same
// durable consumer and applies what was published meanwhile, after what it
// applied before, each event once.
func TestJetStreamConsumerReconnects(t *testing.T) {
	const n = 60
	s := startJetStream(t)
	proxy := harness.StartFaultProxy(t, s.url[len("nats://"):])
	db := consumerDB(t, t.TempDir()+"/consumer.db")
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	c, _ := runJetStreamConsumer(t, in, recordApplied, JetStreamConsumerOptions{Servers: []string{"nats://" + proxy.Addr()}, AckWait: 2 * time.Second})
	publish := func(from, to int) {
		for seq := from; seq <= to; seq++ {
			id := outbox.NewID()
			s.publish(t, "pos.a", id, jsEvent(id, seq), nil)
		}
	}
	publish(1, n/2)
	eventually(t, 10*time.Second, "the first half applied", func() bool { return c.Stats().Applied == n/2 })
	proxy.Down()
	eventually(t, 10*time.Second, "disconnected", func() bool { return !c.Stats().Connected })
	publish(n/2+1, n)
	require.NoError(t, proxy.Up())
	eventually(t, 10*time.Second, "every event applied", func() bool { return c.Stats().Applied == n })
	require.Equal(t, oneToN(n), appliedSeqs(t, db))
	require.GreaterOrEqual(t, proxy.Connected(), int64(2))
}
