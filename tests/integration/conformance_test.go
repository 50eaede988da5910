package integration

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/outboxtest"
)

// conformance is the MQTT publisher, to the brokers of set, as the
// conformance suite sees it: each case's relays reach the broker through a
// fault proxy of the case's own (Cut, Down, Withhold and Pause act on it),
// and its subscriber straight at the broker.
func conformance(k brokerKind, set *brokerSet) outboxtest.Transport {
	tr := outboxtest.Transport{
		Features: outboxtest.Features{Protocol: set.proto.String()},
		Broker: func(t *testing.T) outboxtest.Broker {
			return set.plain.conformanceBroker(t, "", "pos/orders", "pos/#")
		},
	}
	if d := set.denial; d != nil {
		f := k.denied311
		if set.proto == outbox.Protocol5 {
			f = k.denied5
		}
		tr.Features.Refusal, tr.Features.RefusalReason = f.Refusal, f.RefusalReason
		tr.Refusing = func(t *testing.T) outboxtest.Broker {
			tg := d.target
			b := tg.conformanceBroker(t, "till-1", d.allowed, d.filter)
			b.Refused = d.denied
			b.AfterRefusal = func(t *testing.T) {
				if d.logSays != "" {
					require.Contains(t, tg.log(), d.logSays, "the broker's log says why")
				}
				if f.Refusal == outboxtest.AckedAndDropped {
					for _, s := range d.logSilent {
						require.NotContains(t, tg.log(), s, "not in the log")
					}
				}
			}
			return b
		}
	}
	if set.limited != nil && set.proto == outbox.Protocol5 {
		tr.Limited = func(t *testing.T, limit int) outboxtest.Broker {
			return set.limited(t, limit).on(set.proto).conformanceBroker(t, "", "pos/orders", "pos/#")
		}
	}
	return tr
}

// conformanceBroker is tg for one case of the conformance suite: its
// Publishers, under clientID ("": a random one each), publish to topic
// through a fault proxy of the case's own; its subscriber, a persistent
// session of its own, sees filter.
func (tg *target) conformanceBroker(t *testing.T, clientID, topic, filter string) outboxtest.Broker {
	p := harness.StartFaultProxy(t, tg.addr)
	return outboxtest.Broker{
		Publisher: func() outbox.Publisher { return newPublisher(t, p.URL(), tg.login, clientID, tg.proto) },
		Subscribe: func(got func(outbox.Event, error)) {
			deliver := func(payload []byte) { got(outbox.DecodeEvent(payload)) }
			if tg.inline != nil {
				tg.inline(t, filter, deliver)
				return
			}
			harness.StartSubscriber(t, tg.addr, harness.SubscriberOptions{ClientID: "conf-" + outbox.NewID()[24:] + tg.suffix, Filter: filter,
				Username: tg.login.username, Password: tg.login.password, OnMessage: deliver}, eventIDSeq)
		},
		Topic:    topic,
		Cut:      p.EndDrop,
		Down:     func() func() { p.Down(); return func() { require.NoError(t, p.Up()) } },
		Withhold: func() { p.Drop(harness.ToClient) },
		Pause:    func() func() { p.Stall(); return p.EndStall },
	}
}
