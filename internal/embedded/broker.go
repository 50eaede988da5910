// Package embedded runs an in-process MQTT broker (mochi) on loopback for
// outboxctl's demo: the harness's (internal/harness), which can go away and
// come back on the same address with its subscriber inside it, so that the
// subscriber is there before any client can publish again after an outage.
package embedded

import "github.com/edgeoutbox/outbox/internal/harness"

// Broker is a restartable in-process broker that allows every client:
// Addr, URL, Stop and Resume (on the same address).
type Broker = harness.Mochi

// Start starts a broker on a free loopback port; deliver receives every
// message published under filter.
func Start(filter string, deliver func(topic string, payload []byte)) (*Broker, error) {
	b, err := harness.LaunchMochi(harness.MochiOptions{})
	if err != nil {
		return nil, err
	}
	if err := b.Subscribe(filter, func(m harness.Message) { deliver(m.Topic, m.Payload) }); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}
