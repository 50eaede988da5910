package outboxtest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/outboxtest"
)

// TestFake runs the suite against the FakeBroker, once for each way it can
// refuse a publish.
func TestFake(t *testing.T) {
	for _, mode := range []outboxtest.RefusalMode{outboxtest.RefusedForGood, outboxtest.RefusedForNow,
		outboxtest.RefusedByClosing, outboxtest.AckedAndDropped} {
		t.Run(mode.String(), func(t *testing.T) { outboxtest.Run(t, fakeTransport(mode)) })
	}
}

// TestFakeBroker checks the controls the suite does not reach through a
// relay, one publish at a time.
func TestFakeBroker(t *testing.T) {
	ctx := context.Background()
	b := outboxtest.NewFakeBroker(outboxtest.FakeBrokerOptions{MaxInFlight: 3, Properties: true})
	var got []outboxtest.FakeMessage
	b.Subscribe(func(m outboxtest.FakeMessage) { got = append(got, m) })
	p := b.NewPublisher()
	done := func(tok outbox.Token) bool {
		select {
		case <-tok.Done():
			return true
		default:
			return false
		}
	}

	require.ErrorIs(t, p.Publish("a", nil).Error(), outbox.ErrNotConnected, "published before Connect")
	require.Nil(t, p.ConnectionLost())
	require.NoError(t, p.Connect(ctx))
	require.Equal(t, 3, p.MaxInFlight())
	require.True(t, p.CarriesProperties())
	lost := p.ConnectionLost()

	// Withheld acknowledgements, released in order.
	b.Withhold()
	toks := []outbox.Token{p.Publish("a", []byte("1")), p.Publish("a", []byte("2"))}
	require.Len(t, got, 2, "routed while their acknowledgements are withheld")
	require.Equal(t, 2, b.Withheld())
	require.False(t, done(toks[0]) || done(toks[1]))
	require.Equal(t, 1, b.Release(1))
	require.True(t, done(toks[0]) && toks[0].Error() == nil)
	require.False(t, done(toks[1]))

	// Over the limit: the connection closes, what awaited fails.
	over := []outbox.Token{p.Publish("a", []byte("3")), p.Publish("a", []byte("4")), p.Publish("a", []byte("5"))}
	require.Error(t, over[2].Error(), "the fourth awaiting acknowledgement")
	require.Error(t, toks[1].Error(), "failed with its connection")
	select {
	case <-lost:
	default:
		t.Fatal("ConnectionLost not closed when the broker closed the connection")
	}
	require.Equal(t, 3, b.PeakInFlight())
	require.Error(t, p.Publish("a", nil).Error(), "published on a lost connection")

	// Paused: neither routed nor acknowledged, until Resume; then in order.
	b.Cut() // ends the withholding
	require.NoError(t, p.Connect(ctx))
	b.Pause()
	got = nil
	paused := []outbox.Token{p.Publish("a", []byte("6")), p.PublishWithProperties("a", []byte("7"), outbox.PublishProperties{ContentType: "text/plain"})}
	require.Empty(t, got)
	require.False(t, done(paused[0]))
	b.Resume()
	require.NoError(t, paused[0].Error())
	require.NoError(t, paused[1].Error())
	require.Equal(t, []string{"6", "7"}, []string{string(got[0].Payload), string(got[1].Payload)})
	require.Equal(t, "text/plain", got[1].Properties.ContentType)

	// Refusals.
	b.Refuse("good", outboxtest.RefusedForGood, "no")
	b.Refuse("now", outboxtest.RefusedForNow, "later")
	b.Refuse("dropped", outboxtest.AckedAndDropped, "")
	b.Refuse("closing", outboxtest.RefusedByClosing, "bye")
	var refusal *outbox.Refusal
	err := p.Publish("good", nil).Error()
	require.ErrorAs(t, err, &refusal)
	require.ErrorIs(t, err, outbox.ErrUndeliverable)
	err = p.Publish("now", nil).Error()
	require.ErrorIs(t, err, outbox.ErrRejected)
	require.NotErrorIs(t, err, outbox.ErrUndeliverable)
	got = nil
	require.NoError(t, p.Publish("dropped", nil).Error())
	require.Empty(t, got, "an acknowledged and dropped publish routed")
	err = p.Publish("closing", nil).Error()
	require.ErrorContains(t, err, "bye")
	require.NotErrorIs(t, err, outbox.ErrRejected, "a closed connection is the connection's fault")

	// Down refuses connections until Up.
	b.Down()
	require.Error(t, p.Connect(ctx))
	b.Up()
	require.NoError(t, p.Connect(ctx))
	p.Disconnect()
	require.ErrorIs(t, p.Publish("a", nil).Error(), outbox.ErrNotConnected)
	require.Equal(t, 3, b.Connects(), "the refused Connect not counted")
}
