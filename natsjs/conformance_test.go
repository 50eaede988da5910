package natsjs_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/natsjs"
	"github.com/edgeoutbox/outbox/outboxtest"
)

// TestConformance runs the transport conformance suite on the Publisher,
// against one nats-server whose stream POS captures pos.>, and whose
// stream DENIED (denied.>) takes messages of at most 16 bytes: every
// publish there is refused for itself, for good. Each case's relays reach
// the server through a fault proxy of the case's own; its subscriber, a
// core NATS subscription straight at the server, sees the case's own
// topic only.
func TestConformance(t *testing.T) {
	s := startJS(t)
	s.stream(t, "POS", "pos.>")
	_, err := s.js.CreateStream(context.Background(), jetstreamDenied)
	require.NoError(t, err)

	broker := func(t *testing.T) outboxtest.Broker {
		p := harness.StartFaultProxy(t, strings.TrimPrefix(s.url, "nats://"))
		topic := "pos/" + outbox.NewID()
		return outboxtest.Broker{
			Publisher: func() outbox.Publisher { return newPublisher(t, "nats://"+p.Addr()) },
			Subscribe: func(got func(outbox.Event, error)) {
				nc, err := nats.Connect(s.url)
				require.NoError(t, err)
				t.Cleanup(nc.Close)
				subject, err := natsjs.Subject(topic)
				require.NoError(t, err)
				_, err = nc.Subscribe(subject, func(m *nats.Msg) { got(outbox.DecodeEvent(m.Data)) })
				require.NoError(t, err)
				require.NoError(t, nc.Flush())
			},
			Topic:    topic,
			Refused:  "denied/orders",
			Cut:      p.EndDrop,
			Down:     func() func() { p.Down(); return func() { require.NoError(t, p.Up()) } },
			Withhold: func() { p.Drop(harness.ToClient) },
			Pause:    func() func() { p.Stall(); return p.EndStall },
		}
	}
	outboxtest.Run(t, outboxtest.Transport{
		Features: outboxtest.Features{Refusal: outboxtest.RefusedForGood, RefusalReason: "natsjs: the stream refused the message: message size exceeds maximum allowed",
			Protocol: "NATS JetStream"},
		Broker:   broker,
		Refusing: broker,
	})
}

var jetstreamDenied = jetstream.StreamConfig{Name: "DENIED", Subjects: []string{"denied.>"}, MaxMsgSize: 16}
