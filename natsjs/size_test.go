package natsjs_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestOverMaxPayloadIsDead: against a server whose max_payload is 1 KiB,
// an event that cannot fit it — its payload alone, or with the headers of
// binary mode — is parked dead at once, its reason naming the server's
// limit, and the events around it go, in commit order.
func TestOverMaxPayloadIsDead(t *testing.T) {
	n := harness.StartNATSWith(t, []string{"max_payload: 1024"})
	url := "nats://" + n.Addr
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	for _, c := range []struct {
		env     outbox.Envelope
		payload int // over 1 KiB with its encoding, or with its headers
	}{
		{outbox.EnvelopeCloudEvents, 1100},
		{outbox.EnvelopeCloudEventsBinary, 1000},
	} {
		t.Run(c.env.String(), func(t *testing.T) {
			ctx := context.Background()
			name := strings.ToUpper(c.env.String())
			st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
			require.NoError(t, err)
			topic := name + "/orders"
			ob := openOutbox(t)
			for _, size := range []int{10, c.payload, 10} {
				require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
					return ob.Enqueue(ctx, tx, outbox.Message{Topic: topic, Payload: []byte(`"` + strings.Repeat("x", size-2) + `"`)})
				}))
			}
			recs, err := ob.List(ctx, outbox.ListOptions{})
			require.NoError(t, err)
			require.Len(t, recs, 3)
			runRelay(t, ob, newPublisher(t, url), c.env)
			waitFor(t, 10*time.Second, "nothing pending", func() bool { return pending(t, ob) == 0 })
			dead, err := ob.List(ctx, outbox.ListOptions{State: outbox.StateDead})
			require.NoError(t, err)
			require.Len(t, dead, 1)
			require.Equal(t, recs[1].ID, dead[0].ID)
			require.Contains(t, dead[0].LastError, "exceeds the server's max_payload of 1024 bytes")
			require.Equal(t, []string{recs[0].ID, recs[2].ID}, msgIDs(stored(t, st)))
			t.Logf("parked after %d attempts: %s", dead[0].Attempts, dead[0].LastError)
		})
	}
}

// TestCheckSize: the Publisher is an outbox.SizeLimiter whose limit is the
// connected server's max_payload, headers counted; unknown, and nothing
// refused, while it is not connected.
func TestCheckSize(t *testing.T) {
	n := harness.StartNATSWith(t, []string{"max_payload: 1024"})
	pub := newPublisher(t, "nats://"+n.Addr)
	var sl outbox.SizeLimiter = pub
	require.NoError(t, sl.CheckSize("pos/a", 1<<20, nil), "not connected: the token says")
	require.NoError(t, pub.Connect(context.Background()))
	defer pub.Disconnect()
	require.NoError(t, sl.CheckSize("pos/a", 1024, nil))
	require.ErrorContains(t, sl.CheckSize("pos/a", 1025, nil), "exceeds the server's max_payload of 1024 bytes")
	props := &outbox.PublishProperties{ContentType: "application/json", User: []outbox.UserProperty{{Key: "id", Value: "ev-1"}, {Key: "source", Value: "/t"}}}
	hdr := len("NATS/1.0\r\n") + len("Content-Type: application/json\r\n") + len("ce-id: ev-1\r\n") + len("Nats-Msg-Id: ev-1\r\n") + len("ce-source: /t\r\n") + len("\r\n")
	require.NoError(t, sl.CheckSize("pos/a", 1024-hdr, props))
	require.Error(t, sl.CheckSize("pos/a", 1024-hdr+1, props), "the headers count")
	// As nats.go counts them: at the limit it publishes (no stream takes
	// it: an outage), one byte over it refuses.
	for over, refused := range []bool{false, true} {
		tok := pub.PublishWithProperties("pos/a", make([]byte, 1024-hdr+over), *props)
		select {
		case <-tok.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("no answer")
		}
		require.Equal(t, refused, errors.Is(tok.Error(), outbox.ErrUndeliverable), "%d bytes over: %v", over, tok.Error())
	}
}
