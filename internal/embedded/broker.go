// Package embedded runs an in-process MQTT broker (mochi) on loopback for
// outboxctl's demo and benchmarks: one that can go away and come back on the
// same address, with a subscriber inside it, so that the subscriber is
// there before any client can publish again after an outage.
package embedded

import (
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Broker is a restartable in-process broker that allows every client.
type Broker struct {
	addr    string
	filter  string
	deliver func(topic string, payload []byte)

	mu  sync.Mutex
	srv *mochi.Server
}

// Start starts a broker on a free loopback port; deliver receives every
// message published under filter.
func Start(filter string, deliver func(topic string, payload []byte)) (*Broker, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	b := &Broker{addr: addr, filter: filter, deliver: deliver}
	return b, b.Resume()
}

// Addr is host:port; URL is tcp://host:port.
func (b *Broker) Addr() string { return b.addr }
func (b *Broker) URL() string  { return "tcp://" + b.addr }

// Resume brings a stopped broker back on the same address.
func (b *Broker) Resume() error {
	srv := mochi.New(&mochi.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return err
	}
	// Right after a stop the port may take a moment to be free again.
	var err error
	for i := 0; i < 100; i++ {
		if err = srv.AddListener(listeners.NewTCP(listeners.Config{ID: "tcp", Address: b.addr})); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	if err := srv.Subscribe(b.filter, 1, func(_ *mochi.Client, _ packets.Subscription, pk packets.Packet) {
		b.deliver(pk.TopicName, pk.Payload)
	}); err != nil {
		return err
	}
	if err := srv.Serve(); err != nil {
		return err
	}
	b.mu.Lock()
	b.srv = srv
	b.mu.Unlock()
	return nil
}

// Stop takes the broker away: connections drop, new ones are refused.
func (b *Broker) Stop() {
	b.mu.Lock()
	srv := b.srv
	b.srv = nil
	b.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}
