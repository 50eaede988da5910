package consumer

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// TestBadInputRefused: the consumer side's constructors and Apply refuse
// bad input with an error and write nothing.
func TestBadInputRefused(t *testing.T) {
	ctx := context.Background()
	db, err := outbox.OpenDB(filepath.Join(t.TempDir(), "c.db"), outbox.DBOptions{})
	require.NoError(t, err)
	defer db.Close()
	in, err := NewInbox(ctx, db, InboxOptions{})
	require.NoError(t, err)
	noop := func(context.Context, *sql.Tx, outbox.Event) error { return nil }

	errs := []struct {
		name string
		err  error
	}{
		{"NewInbox with a nil db", func() error { _, err := NewInbox(ctx, nil, InboxOptions{}); return err }()},
		{"NewInbox with a negative window", func() error { _, err := NewInbox(ctx, db, InboxOptions{DedupeWindow: -time.Hour}); return err }()},
		{"NewSubscriber without an inbox", func() error {
			_, err := NewSubscriber(nil, noop, SubscriberOptions{Broker: "tcp://127.0.0.1:1", ClientID: "c", Topics: []string{"t"}})
			return err
		}()},
		{"NewSubscriber without a handler", func() error {
			_, err := NewSubscriber(in, nil, SubscriberOptions{Broker: "tcp://127.0.0.1:1", ClientID: "c", Topics: []string{"t"}})
			return err
		}()},
		{"NewSubscriber without a client id", func() error {
			_, err := NewSubscriber(in, noop, SubscriberOptions{Broker: "tcp://127.0.0.1:1", Topics: []string{"t"}})
			return err
		}()},
		{"NewSubscriber without topics", func() error {
			_, err := NewSubscriber(in, noop, SubscriberOptions{Broker: "tcp://127.0.0.1:1", ClientID: "c"})
			return err
		}()},
		{"NewSubscriber with a bad URL", func() error {
			_, err := NewSubscriber(in, noop, SubscriberOptions{Broker: "udp://x:1", ClientID: "c", Topics: []string{"t"}})
			return err
		}()},
		{"Apply of an event with an id but no source", in.Apply(ctx, outbox.Event{ID: "x"}, noop)},
	}
	for _, e := range errs {
		require.Error(t, e.err, e.name)
	}
	st, err := in.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Applied+st.Quarantined, "nothing was written")
}

// TestSubscriberBrokerURLChecked: NewSubscriber checks its broker URLs with
// the publisher's rule and says what a good one looks like; a port out of
// range and a path were accepted, and the port retried for ever.
func TestSubscriberBrokerURLChecked(t *testing.T) {
	db, err := outbox.OpenDB(filepath.Join(t.TempDir(), "c.db"), outbox.DBOptions{})
	require.NoError(t, err)
	defer db.Close()
	in, err := NewInbox(context.Background(), db, InboxOptions{})
	require.NoError(t, err)
	noop := func(context.Context, *sql.Tx, outbox.Event) error { return nil }
	for url, want := range map[string]string{
		"127.0.0.1:1883":        "has no scheme: write tcp://127.0.0.1:1883",
		"tcp://127.0.0.1:99999": "port 99999 is not 1 to 65535",
		"mqtt://host:1883/path": "MQTT takes no path, query or fragment: write mqtt://host:1883",
	} {
		_, err := NewSubscriber(in, noop, SubscriberOptions{Brokers: []string{"tcp://127.0.0.1:1883", url}, ClientID: "c", Topics: []string{"t"}})
		require.ErrorContains(t, err, want, url)
	}
}
