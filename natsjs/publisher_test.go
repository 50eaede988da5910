package natsjs_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
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

// jsServer is a nats-server with JetStream and a connection of the test's
// own to it, to make streams and read them.
type jsServer struct {
	url string
	js  jetstream.JetStream
}

func startJS(t *testing.T) *jsServer {
	t.Helper()
	n := harness.StartNATS(t)
	url := "nats://" + n.Addr
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return &jsServer{url: url, js: js}
}

// stream creates a stream capturing subjects, with a duplicate window of
// two minutes.
func (s *jsServer) stream(t *testing.T, name string, subjects ...string) jetstream.Stream {
	t.Helper()
	st, err := s.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: subjects, Duplicates: 2 * time.Minute})
	require.NoError(t, err)
	return st
}

// stored is every message in st, in stream order.
func stored(t *testing.T, st jetstream.Stream) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	info, err := st.Info(ctx)
	require.NoError(t, err)
	var msgs []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		require.NoError(t, err)
		msgs = append(msgs, m)
	}
	return msgs
}

func newPublisher(t *testing.T, servers ...string) *natsjs.Publisher {
	t.Helper()
	p, err := natsjs.New(natsjs.Options{Servers: servers})
	require.NoError(t, err)
	return p
}

func openOutbox(t *testing.T) *outbox.Outbox {
	t.Helper()
	ob, err := outbox.Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"), outbox.Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	return ob
}

// commit commits n events to topic, one transaction each, and returns
// their ids in commit order.
func commit(t *testing.T, ob *outbox.Outbox, topic string, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := range n {
		require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: topic, Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
		}))
	}
	recs, err := ob.List(ctx, outbox.ListOptions{Limit: n + 1})
	require.NoError(t, err)
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	require.Len(t, ids, n)
	return ids
}

// runRelay runs a relay on ob through pub until the test ends.
func runRelay(t *testing.T, ob *outbox.Outbox, pub outbox.Publisher, env outbox.Envelope) *outbox.Relay {
	t.Helper()
	r, err := ob.NewRelay(pub, outbox.RelayOptions{
		Source:          "/natsjs-test",
		Envelope:        env,
		Window:          32,
		Reconnect:       outbox.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		AckTimeout:      5 * time.Second,
		ShutdownTimeout: 5 * time.Second,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, bounded by the deadline
	}
}

func pending(t *testing.T, ob *outbox.Outbox) int {
	t.Helper()
	recs, err := ob.List(context.Background(), outbox.ListOptions{Limit: 1000})
	require.NoError(t, err)
	return len(recs)
}

// msgIDs are the Nats-Msg-Id headers of msgs, in order.
func msgIDs(msgs []*jetstream.RawStreamMsg) []string {
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	return ids
}

// TestDeliversEachEventOnceInCommitOrder: the stream holds every committed
// event once, in commit order, each with its event id as Nats-Msg-Id, in
// structured and in binary mode (the attributes as ce- headers).
func TestDeliversEachEventOnceInCommitOrder(t *testing.T) {
	s := startJS(t)
	for _, env := range []outbox.Envelope{outbox.EnvelopeCloudEvents, outbox.EnvelopeCloudEventsBinary} {
		t.Run(env.String(), func(t *testing.T) {
			st := s.stream(t, "POS_"+strings.ToUpper(env.String()), "pos."+env.String()+".>")
			ob := openOutbox(t)
			ids := commit(t, ob, "pos/"+env.String()+"/orders", 200)
			runRelay(t, ob, newPublisher(t, s.url), env)
			waitFor(t, 10*time.Second, "every event sent", func() bool { return pending(t, ob) == 0 })

			msgs := stored(t, st)
			require.Equal(t, ids, msgIDs(msgs), "every event once, in commit order")
			for i, m := range msgs {
				require.Equal(t, "pos."+env.String()+".orders", m.Subject)
				if env == outbox.EnvelopeCloudEventsBinary {
					require.Equal(t, ids[i], m.Header.Get("ce-id"))
					require.Equal(t, "/natsjs-test", m.Header.Get("ce-source"))
					require.Equal(t, fmt.Sprintf(`{"n":%d}`, i), string(m.Data))
					continue
				}
				ev, err := outbox.DecodeEvent(m.Data)
				require.NoError(t, err)
				require.Equal(t, ids[i], ev.ID)
			}
		})
	}
}

// TestResendWithinWindowAddsNothing: publishing the same events again, as
// a relay that was killed before it recorded their PubAcks does, adds
// nothing to the stream, and each re-send counts as sent.
func TestResendWithinWindowAddsNothing(t *testing.T) {
	s := startJS(t)
	st := s.stream(t, "POS", "pos.>")
	ob := openOutbox(t)
	ids := commit(t, ob, "pos/orders", 50)
	runRelay(t, ob, newPublisher(t, s.url), outbox.EnvelopeCloudEvents)
	waitFor(t, 10*time.Second, "every event sent", func() bool { return pending(t, ob) == 0 })
	first := stored(t, st)
	require.Equal(t, ids, msgIDs(first))

	pub := newPublisher(t, s.url)
	require.NoError(t, pub.Connect(context.Background()))
	defer pub.Disconnect()
	var tokens []outbox.Token
	for _, m := range first {
		tokens = append(tokens, pub.Publish("pos/orders", m.Data))
	}
	for i, tok := range tokens {
		select {
		case <-tok.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("re-send %d: no PubAck", i)
		}
		require.NoError(t, tok.Error(), "a duplicate is sent")
	}
	info, err := st.Info(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, len(ids), info.State.Msgs, "duplicates = 0 in the stream")
	require.Equal(t, ids, msgIDs(stored(t, st)))
}

// TestNoStreamStaysPending: with no stream capturing the subject, the
// events stay pending and the relay says why; once a stream appears they
// are delivered, once each, in commit order.
func TestNoStreamStaysPending(t *testing.T) {
	s := startJS(t)
	ob := openOutbox(t)
	ids := commit(t, ob, "pos/orders", 20)
	r := runRelay(t, ob, newPublisher(t, s.url), outbox.EnvelopeCloudEvents)
	waitFor(t, 10*time.Second, "the relay says no stream captures the subject", func() bool {
		st, err := r.Stats(context.Background())
		require.NoError(t, err)
		return strings.Contains(st.LastError, `no stream captures the subject "pos.orders"`)
	})
	require.Equal(t, len(ids), pending(t, ob), "nothing sent, nothing dead")
	dead, err := ob.List(context.Background(), outbox.ListOptions{State: outbox.StateDead})
	require.NoError(t, err)
	require.Empty(t, dead)

	st := s.stream(t, "POS", "pos.>")
	waitFor(t, 10*time.Second, "every event sent once a stream captures them", func() bool { return pending(t, ob) == 0 })
	require.Equal(t, ids, msgIDs(stored(t, st)))
}

// TestStreamFullStaysPending: a stream that discards new messages once
// full makes the events an outage, not dead: they stay pending, the relay
// says why, and go once the operator raises the limit.
func TestStreamFullStaysPending(t *testing.T) {
	s := startJS(t)
	ctx := context.Background()
	cfg := jetstream.StreamConfig{Name: "POS", Subjects: []string{"pos.>"}, Duplicates: 2 * time.Minute, MaxMsgs: 5, Discard: jetstream.DiscardNew}
	st, err := s.js.CreateStream(ctx, cfg)
	require.NoError(t, err)
	ob := openOutbox(t)
	ids := commit(t, ob, "pos/orders", 20)
	r := runRelay(t, ob, newPublisher(t, s.url), outbox.EnvelopeCloudEvents)
	waitFor(t, 10*time.Second, "the relay says the stream cannot take the message", func() bool {
		st, err := r.Stats(ctx)
		require.NoError(t, err)
		return strings.Contains(st.LastError, "the stream cannot take the message")
	})
	waitFor(t, 5*time.Second, "the five the stream took sent, the rest pending", func() bool { return pending(t, ob) == len(ids)-5 })
	dead, err := ob.List(ctx, outbox.ListOptions{State: outbox.StateDead})
	require.NoError(t, err)
	require.Empty(t, dead, "nothing dead")

	cfg.MaxMsgs = -1
	_, err = s.js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "every event sent once the limit is raised", func() bool { return pending(t, ob) == 0 })
	require.Equal(t, ids, msgIDs(stored(t, st)))
}

// TestCredentials: a server that asks for a user and password takes the
// Publisher's, and a wrong password fails Connect, saying so.
func TestCredentials(t *testing.T) {
	n := harness.StartNATSWith(t, []string{`authorization { user: till7, password: "s3cret-pw" }`})
	url := "nats://" + n.Addr
	bad, err := natsjs.New(natsjs.Options{Servers: []string{url}, User: "till7", Password: "wrong"})
	require.NoError(t, err)
	err = bad.Connect(context.Background())
	require.ErrorContains(t, err, "Authorization Violation")
	require.NotContains(t, err.Error(), "wrong", "no password in the error")

	nc, err := nats.Connect(url, nats.UserInfo("till7", "s3cret-pw"))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "POS", Subjects: []string{"pos.>"}})
	require.NoError(t, err)
	pub, err := natsjs.New(natsjs.Options{Servers: []string{url}, User: "till7", Password: "s3cret-pw"})
	require.NoError(t, err)
	require.NoError(t, pub.Connect(context.Background()))
	defer pub.Disconnect()
	require.Equal(t, url, pub.Broker())
	tok := pub.Publish("pos/orders", []byte(`{"specversion":"1.0","id":"ev-1","source":"/t"}`))
	select {
	case <-tok.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("no PubAck")
	}
	require.NoError(t, tok.Error())
	require.Equal(t, []string{"ev-1"}, msgIDs(stored(t, st)))
}

// TestTopicNoSubjectCanHoldIsDead: a topic with a space, which no subject
// can hold (nor NATS's MQTT listener take), is parked dead at once with
// the reason; the events beside it go, in commit order.
func TestTopicNoSubjectCanHoldIsDead(t *testing.T) {
	s := startJS(t)
	st := s.stream(t, "POS", "pos.>")
	ob := openOutbox(t)
	ctx := context.Background()
	var want []string
	for i, topic := range []string{"pos/a", "pos/a b", "pos/a"} {
		require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: topic, Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
		}))
	}
	recs, err := ob.List(ctx, outbox.ListOptions{})
	require.NoError(t, err)
	want = []string{recs[0].ID, recs[2].ID}
	runRelay(t, ob, newPublisher(t, s.url), outbox.EnvelopeCloudEvents)
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pending(t, ob) == 0 })
	dead, err := ob.List(ctx, outbox.ListOptions{State: outbox.StateDead})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, recs[1].ID, dead[0].ID)
	require.Equal(t, 1, dead[0].Attempts, "parked at once")
	require.Contains(t, dead[0].LastError, "white space")
	require.Equal(t, want, msgIDs(stored(t, st)))
}
