package harness

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Message is one message a broker routed to a subscriber inside it. Its
// Payload is the broker's: a subscriber that keeps it past the call copies
// it (a Recorder does).
type Message struct {
	Topic   string
	Payload []byte
	Client  string // the client that published it
	// ContentType and User are the MQTT 5 properties the publisher gave
	// (none over 3.1.1): a batch's or a compressed payload's marks.
	ContentType string
	User        []packets.UserProperty
}

// MochiOptions shape an in-process broker.
type MochiOptions struct {
	// TLS, if set, makes the listener TLS with this configuration.
	TLS *tls.Config
	// Hooks are the broker's hooks (authentication, ACLs); none means one
	// that lets every client in and allows every topic.
	Hooks []mochi.Hook
	// Capabilities, if set, changes mochi's defaults: what it tells MQTT 5
	// clients in the CONNACK (Receive Maximum, Maximum Packet Size) and
	// enforces.
	Capabilities func(*mochi.Capabilities)
}

// Mochi is an in-process mochi broker on a loopback port of its own. It
// can be stopped (connections drop, new ones are refused) and resumed on
// the same address, with the subscriptions made through Subscribe in place
// before any client can publish again.
type Mochi struct {
	opts MochiOptions
	addr string

	mu   sync.Mutex
	srv  *mochi.Server
	ln   *ownedListener // srv's, while it runs
	subs []subscription
}

type subscription struct {
	filter string
	fn     func(Message)
}

// LaunchMochi starts an in-process broker on a free loopback port; Close
// stops it.
func LaunchMochi(o MochiOptions) (*Mochi, error) {
	m := &Mochi{opts: o, addr: "127.0.0.1:0"}
	return m, m.Resume()
}

// StartMochi starts an in-process broker that lives as long as tb.
func StartMochi(tb TB, o MochiOptions) *Mochi {
	tb.Helper()
	m, err := LaunchMochi(o)
	must(tb, err, "mochi")
	tb.Cleanup(m.Close)
	return m
}

// Addr is the broker's host:port.
func (m *Mochi) Addr() string { return m.addr }

// URL is the broker's URL: tcp://host:port, or ssl:// with TLS.
func (m *Mochi) URL() string {
	if m.opts.TLS != nil {
		return "ssl://" + m.addr
	}
	return "tcp://" + m.addr
}

// Server is the running mochi server, for what the harness does not wrap
// (its clients, a hook of the caller's); nil while stopped. A hook added
// to it is gone after Stop.
func (m *Mochi) Server() *mochi.Server {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.srv
}

// Subscribe has fn called with every message published to a topic that
// matches filter, from now on and after every Resume. Calls for one
// subscription come one at a time, in the order the broker routes them.
func (m *Mochi) Subscribe(filter string, fn func(Message)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.subs = append(m.subs, subscription{filter, fn})
	if m.srv == nil {
		return nil
	}
	return m.subscribe(m.srv, len(m.subs)-1)
}

func (m *Mochi) subscribe(srv *mochi.Server, i int) error {
	s := m.subs[i]
	return srv.Subscribe(s.filter, i+1, func(_ *mochi.Client, _ packets.Subscription, pk packets.Packet) {
		s.fn(Message{Topic: pk.TopicName, Payload: pk.Payload, Client: pk.Origin,
			ContentType: pk.Properties.ContentType, User: pk.Properties.User})
	})
}

// Resume brings a stopped broker back on the same address.
func (m *Mochi) Resume() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.srv != nil {
		return nil
	}
	caps := mochi.NewDefaultServerCapabilities()
	if m.opts.Capabilities != nil {
		m.opts.Capabilities(caps)
	}
	srv := mochi.New(&mochi.Options{InlineClient: true, Capabilities: caps, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	hooks := m.opts.Hooks
	if len(hooks) == 0 {
		hooks = []mochi.Hook{new(auth.AllowHook)}
	}
	for _, h := range hooks {
		if err := srv.AddHook(h, nil); err != nil {
			return err
		}
	}
	// Right after a stop the port may take a moment to be free again.
	var owned *ownedListener
	var err error
	for i := 0; i < 100; i++ {
		if owned, err = listenOwned(m.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	var ln net.Listener = owned
	if m.opts.TLS != nil {
		ln = tls.NewListener(owned, m.opts.TLS)
	}
	if err := srv.AddListener(listeners.NewNet("tcp", ln)); err != nil {
		owned.Close()
		return err
	}
	m.addr = owned.Addr().String()
	// Subscribed before it serves: no publish can get past a subscriber.
	for i := range m.subs {
		if err := m.subscribe(srv, i); err != nil {
			owned.end()
			srv.Close()
			return err
		}
	}
	if err := srv.Serve(); err != nil {
		owned.end()
		srv.Close()
		return err
	}
	m.srv, m.ln = srv, owned
	return nil
}

// Stop takes the broker away: connections drop, new ones are refused.
func (m *Mochi) Stop() {
	m.mu.Lock()
	srv, ln := m.srv, m.ln
	m.srv, m.ln = nil, nil
	m.mu.Unlock()
	if srv == nil {
		return
	}
	ln.end() // see ownedListener
	srv.Close()
}

// Close stops the broker for good.
func (m *Mochi) Close() { m.Stop() }

// DenyPublish lets every client in and refuses its publishes to topics
// under Prefix, as an ACL would; mochi closes the connection then, as an
// MQTT 3.1.1 broker does.
type DenyPublish struct {
	mochi.HookBase
	Prefix string
}

// ID names the hook.
func (h *DenyPublish) ID() string { return "deny-publish" }

// Provides says which of mochi's events the hook handles.
func (h *DenyPublish) Provides(b byte) bool {
	return b == mochi.OnACLCheck || b == mochi.OnConnectAuthenticate
}

// OnConnectAuthenticate lets every client in.
func (h *DenyPublish) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return true }

// OnACLCheck refuses a write under Prefix.
func (h *DenyPublish) OnACLCheck(_ *mochi.Client, topic string, write bool) bool {
	return !(write && strings.HasPrefix(topic, h.Prefix))
}

// Recorder keeps what a broker routed to it, in order: each message as
// keep made it on arrival (its event decoded, say), so that reading the
// record costs nothing.
type Recorder[T any] struct {
	mu   sync.Mutex
	msgs []T
}

// Record subscribes a new Recorder to filter on m. The broker's own $SYS
// messages are left out; keep gets a copy of the payload.
func Record[T any](m *Mochi, filter string, keep func(Message) T) (*Recorder[T], error) {
	r := &Recorder[T]{}
	return r, m.Subscribe(filter, func(msg Message) {
		if strings.HasPrefix(msg.Topic, "$") {
			return
		}
		msg.Payload = append([]byte(nil), msg.Payload...)
		v := keep(msg)
		r.mu.Lock()
		r.msgs = append(r.msgs, v)
		r.mu.Unlock()
	})
}

// All returns what was recorded so far.
func (r *Recorder[T]) All() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.msgs...)
}

// Count is how many messages were recorded so far.
func (r *Recorder[T]) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}
