package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBadInputEverywhere: every exported constructor and method refuses
// bad input with an error (or a documented harmless result) and writes
// nothing.
func TestBadInputEverywhere(t *testing.T) {
	ctx := context.Background()
	ob := openTest(t, Options{})
	commitOrder(t, ob, "t", 1)

	errs := []struct {
		name string
		err  error
	}{
		{"Open without a path", func() error { _, err := Open(ctx, "", Options{}); return err }()},
		{"Open of :memory:", func() error { _, err := Open(ctx, ":memory:", Options{}); return err }()},
		{"Open of a file: URI", func() error { _, err := Open(ctx, "file:x.db?mode=rwc", Options{}); return err }()},
		{"Open of a directory", func() error { _, err := Open(ctx, t.TempDir(), Options{}); return err }()},
		{"New with a nil db", func() error { _, err := New(ctx, nil, Options{}); return err }()},
		{"New with a negative payload limit", func() error { _, err := New(ctx, ob.DB(), Options{MaxPayloadBytes: -1}); return err }()},
		{"List of an unknown state", func() error { _, err := ob.List(ctx, ListOptions{State: "lost"}); return err }()},
		{"Get of an unknown id", func() error { _, err := ob.Get(ctx, "nope"); return err }()},
		{"NewRelay without a publisher", func() error { _, err := ob.NewRelay(nil, RelayOptions{}); return err }()},
		{"NewRelay with a negative window", func() error { _, err := ob.NewRelay(&fakePublisher{}, RelayOptions{Window: -5}); return err }()},
		{"DecodeEvent of garbage", func() error { _, err := DecodeEvent([]byte("{")); return err }()},
		{"ParseEnvelope of an unknown mode", func() error { _, err := ParseEnvelope("xml"); return err }()},
		{"ParseBrokerURL without a port", func() error { _, err := ParseBrokerURL("tcp://host"); return err }()},
	}
	for _, e := range errs {
		require.Error(t, e.err, e.name)
	}
	// Harmless results, documented.
	n, err := ob.Requeue(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "Requeue of no ids")
	n, err = ob.Requeue(ctx, "unknown-id")
	require.NoError(t, err)
	require.Zero(t, n, "Requeue of an unknown id changes nothing")
	n, err = ob.PurgeSent(ctx, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.Zero(t, n, "PurgeSent never touches pending rows")
	require.Equal(t, 1, countState(t, ob, "pending"), "nothing was written or removed")
}
