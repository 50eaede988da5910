package natsjs_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/natsjs"
)

// streamNames are the streams on s's server.
func (s *jsServer) streamNames(t *testing.T) []string {
	t.Helper()
	var names []string
	l := s.js.StreamNames(context.Background())
	for n := range l.Name() {
		names = append(names, n)
	}
	require.NoError(t, l.Err())
	return names
}

// TestCreateStreamOnlyWhenAsked: a Publisher without CreateStream creates
// no stream at Connect; one with it creates the stream as StreamSpec says
// (file storage, limits, discard new, the duplicate window), and the relay
// delivers into it, every event once, in commit order.
func TestCreateStreamOnlyWhenAsked(t *testing.T) {
	s := startJS(t)
	ctx := context.Background()
	plain := newPublisher(t, s.url)
	require.NoError(t, plain.Connect(ctx))
	plain.Disconnect()
	require.Empty(t, s.streamNames(t), "no stream unless asked")

	var logs harness.LogBuffer
	spec := &natsjs.StreamSpec{Name: "POS", Subjects: []string{"pos.>"}, MaxBytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	pub, err := natsjs.New(natsjs.Options{Servers: []string{s.url}, CreateStream: spec})
	require.NoError(t, err)
	ob := openOutbox(t)
	ids := commit(t, ob, "pos/orders", 30)
	runRelay(t, ob, pub, outbox.EnvelopeCloudEvents)
	waitFor(t, 10*time.Second, "every event sent", func() bool { return pending(t, ob) == 0 })
	require.Equal(t, []string{"POS"}, s.streamNames(t))
	st, err := s.js.Stream(ctx, "POS")
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	require.Equal(t, []string{"pos.>"}, cfg.Subjects)
	require.Equal(t, jetstream.FileStorage, cfg.Storage)
	require.Equal(t, jetstream.LimitsPolicy, cfg.Retention)
	require.Equal(t, jetstream.DiscardNew, cfg.Discard)
	require.Equal(t, 2*time.Minute, cfg.Duplicates)
	require.Equal(t, 1, cfg.Replicas)
	require.EqualValues(t, 1<<20, cfg.MaxBytes)
	require.Equal(t, ids, msgIDs(stored(t, st)), "every event once, in commit order")
	require.Contains(t, logs.String(), `msg="natsjs: created the stream" stream=POS`)
}

// TestCreateStreamLeavesExistingAlone: when a stream of the name exists,
// Connect uses it as it is, however it differs from the spec.
func TestCreateStreamLeavesExistingAlone(t *testing.T) {
	s := startJS(t)
	ctx := context.Background()
	want := jetstream.StreamConfig{Name: "POS", Subjects: []string{"pos.>"}, Storage: jetstream.MemoryStorage,
		Duplicates: 30 * time.Second, MaxMsgs: 1000, Discard: jetstream.DiscardOld}
	_, err := s.js.CreateStream(ctx, want)
	require.NoError(t, err)

	var logs harness.LogBuffer
	pub, err := natsjs.New(natsjs.Options{Servers: []string{s.url},
		CreateStream: &natsjs.StreamSpec{Name: "POS", Subjects: []string{"pos.>", "till.>"}, MaxBytes: 4096, Logger: slog.New(slog.NewTextHandler(&logs, nil))}})
	require.NoError(t, err)
	require.NoError(t, pub.Connect(ctx))
	defer pub.Disconnect()
	require.Contains(t, logs.String(), "the stream exists: used as it is, not updated")
	st, err := s.js.Stream(ctx, "POS")
	require.NoError(t, err)
	got := st.CachedInfo().Config
	require.Equal(t, want.Subjects, got.Subjects)
	require.Equal(t, want.Storage, got.Storage)
	require.Equal(t, want.Duplicates, got.Duplicates)
	require.Equal(t, want.MaxMsgs, got.MaxMsgs)
	require.Equal(t, want.Discard, got.Discard)
	require.EqualValues(t, -1, got.MaxBytes)
	require.Equal(t, []string{"POS"}, s.streamNames(t))
}

// TestCreatedStreamFullIsAnOutage: a stream the Publisher created, full
// (MaxMsgs), refuses new events rather than dropping its oldest: they stay
// pending, none dead, the relay saying why, and go as the operator makes
// room (here by purging what a consumer has read): every event once, in
// commit order.
func TestCreatedStreamFullIsAnOutage(t *testing.T) {
	s := startJS(t)
	ctx := context.Background()
	pub, err := natsjs.New(natsjs.Options{Servers: []string{s.url},
		CreateStream: &natsjs.StreamSpec{Name: "POS", Subjects: []string{"pos.>"}, MaxMsgs: 5}})
	require.NoError(t, err)
	ob := openOutbox(t)
	ids := commit(t, ob, "pos/orders", 20)
	r := runRelay(t, ob, pub, outbox.EnvelopeCloudEvents)
	var got []string
	for len(got) < len(ids) {
		want := min(len(ids), len(got)+5)
		waitFor(t, 10*time.Second, "the stream full, the rest pending", func() bool {
			return pending(t, ob) == len(ids)-want
		})
		if want < len(ids) {
			waitFor(t, 10*time.Second, "the relay says the stream cannot take the message", func() bool {
				st, err := r.Stats(ctx)
				require.NoError(t, err)
				return strings.Contains(st.LastError, "the stream cannot take the message")
			})
			dead, err := ob.List(ctx, outbox.ListOptions{State: outbox.StateDead})
			require.NoError(t, err)
			require.Empty(t, dead, "nothing dead")
		}
		st, err := s.js.Stream(ctx, "POS")
		require.NoError(t, err)
		got = append(got, msgIDs(stored(t, st))...)
		// Full, the stream takes nothing between the read and the purge.
		require.NoError(t, st.Purge(ctx))
	}
	require.Equal(t, ids, got, "every event once, in commit order")
}

// TestStreamSpecChecked: New refuses a spec NATS would refuse at every
// Connect.
func TestStreamSpecChecked(t *testing.T) {
	for want, spec := range map[string]natsjs.StreamSpec{
		"no stream name":             {Subjects: []string{"pos.>"}},
		"no subjects":                {Name: "POS"},
		"an empty subject":           {Name: "POS", Subjects: []string{""}},
		"replicas":                   {Name: "POS", Subjects: []string{"pos.>"}, Replicas: 7},
		"a negative limit":           {Name: "POS", Subjects: []string{"pos.>"}, MaxMsgs: -1},
		"longer than MaxAge":         {Name: "POS", Subjects: []string{"pos.>"}, MaxAge: time.Minute, Duplicates: 2 * time.Minute},
		"not allow in a stream name": {Name: "P.OS", Subjects: []string{"pos.>"}},
	} {
		_, err := natsjs.New(natsjs.Options{Servers: []string{"nats://127.0.0.1:4222"}, CreateStream: &spec})
		require.ErrorContains(t, err, want)
	}
}
