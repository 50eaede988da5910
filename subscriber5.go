package outbox

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeoutbox/outbox/internal/wait"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	paholog "github.com/eclipse/paho.golang/paho/log"
	netproxy "golang.org/x/net/proxy"
)

// The Subscriber's MQTT 5 connection: paho.golang's Client, a persistent
// session (Clean Start false, a session that does not expire), QoS 1, and
// manual acknowledgement: a PUBACK only after the handler's transaction
// committed.

const (
	// sessionNeverExpires is MQTT 5's Session Expiry Interval for "never":
	// the broker keeps the session, and what is published while the
	// consumer is away, as 3.1.1's clean session false does.
	sessionNeverExpires = 1<<32 - 1
	// ackInterval is how often paho sends the acknowledgements made since
	// (in order). A stop waits for one more round of them; a crash loses
	// those of the last interval at most: their messages come again and
	// the inbox recognises them.
	ackInterval = 10 * time.Millisecond
)

// message5 is a message received over MQTT 5.
type message5 struct {
	pb      *paho.Publish
	c       *paho.Client
	lastAck *atomic.Int64 // when an Ack was last made (Unix ns), for the stop
}

func (m *message5) Topic() string   { return m.pb.Topic }
func (m *message5) Payload() []byte { return m.pb.Payload }

// Ack marks the message acknowledged; paho sends the PUBACK within
// ackInterval. Its error (the connection is gone) means the message comes
// again, which the inbox recognises.
func (m *message5) Ack() {
	_ = m.c.Ack(m.pb)
	m.lastAck.Store(time.Now().UnixNano())
}

// properties returns the message's content type and user properties, for
// DecodeEventMQTT.
func (m *message5) properties() (string, []UserProperty) {
	p := m.pb.Properties
	if p == nil {
		return "", nil
	}
	user := make([]UserProperty, len(p.User))
	for i, u := range p.User {
		user[i] = UserProperty{u.Key, u.Value}
	}
	return p.ContentType, user
}

// session5 runs one MQTT 5 connection until it is lost or ctx ends. An
// error wrapping errUnsupportedVersion or errClosedAfterConnect says the
// broker may not speak 5 (session chooses the version).
func (s *Subscriber) session5(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tlsCfg, err := tlsConfigFor(s.opts.TLSConfig, s.opts.TLSFiles)
	if err != nil {
		return err
	}
	// ConnectTimeout bounds the dial and the CONNACK together.
	cctx, cancelConnect := context.WithTimeout(sctx, s.opts.ConnectTimeout)
	defer cancelConnect()
	raw, err := s.dial5(cctx, tlsCfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("outbox: subscriber mqtt 5 connect: %s: %w", explainConnectError(err, time.Now()), err)
	}
	conn := &firstBytes{Conn: raw}
	var queue queue5
	queue.ready = make(chan struct{}, 1)
	lost := make(chan error, 1)
	setLost := func(err error) {
		select {
		case lost <- err:
		default:
		}
	}
	var lastAck atomic.Int64
	c := paho.NewClient(paho.ClientConfig{
		ClientID:                   s.opts.ClientID,
		Conn:                       packets.NewThreadSafeConn(conn),
		PacketTimeout:              s.opts.ConnectTimeout,
		PingHandler:                &pinger5{timeout: s.opts.PingTimeout},
		EnableManualAcknowledgment: true,
		SendAcksInterval:           ackInterval,
		// paho calls this from one goroutine, in arrival order.
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			queue.push(&message5{pb: pr.Packet, c: pr.Client, lastAck: &lastAck})
			return true, nil
		}},
		OnClientError: setLost,
		OnServerDisconnect: func(d *paho.Disconnect) {
			e := &disconnectError{code: d.ReasonCode}
			if d.Properties != nil {
				e.reason = d.Properties.ReasonString
			}
			setLost(e)
		},
	})
	// No Receive Maximum (65,535, as good as none): mochi, given one
	// lower than a resumed session's backlog, writes the messages beyond
	// it and forgets them at once, so a connection lost then loses them.
	expiry := uint32(sessionNeverExpires)
	cp := &paho.Connect{
		ClientID:   s.opts.ClientID,
		KeepAlive:  uint16(min(s.opts.KeepAlive/time.Second, 65535)),
		CleanStart: false,
		// RequestProblemInfo true is MQTT's default (paho would send 0):
		// mochi, told 0, strips the user properties from every PUBLISH
		// it delivers, and CloudEvents binary mode's attributes with them.
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry, RequestProblemInfo: true},
	}
	if s.opts.Username != "" {
		cp.UsernameFlag, cp.Username = true, s.opts.Username
		cp.PasswordFlag, cp.Password = true, []byte(s.opts.Password)
	}
	ca, err := c.Connect(cctx, cp)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		err = conn.classify(ca, err)
		var ce *connackError
		why := explainConnectError(err, time.Now())
		if errors.As(err, &ce) {
			why = explainConnack(ce)
		}
		return fmt.Errorf("outbox: subscriber mqtt 5 connect: %s: %w", why, err)
	}
	s.spoke5()
	var wg sync.WaitGroup
	defer func() {
		cancel() // ends the Subscribe under way
		// paho sends the acknowledgements every ackInterval and does not
		// send the last ones on Disconnect: on a stop, give its ticker
		// the time to, so that what was applied is not delivered again
		// (at most 2 × ackInterval of waiting).
		if d := time.Until(time.Unix(0, lastAck.Load()).Add(2 * ackInterval)); d > 0 {
			time.Sleep(min(d, 2*ackInterval))
		}
		_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
		wg.Wait()
	}()
	subs := make([]paho.SubscribeOptions, len(s.opts.Topics))
	for i, t := range s.opts.Topics {
		subs[i] = paho.SubscribeOptions{Topic: t, QoS: 1}
	}
	// A resumed session's messages come before the SUBACK: they are
	// applied while the SUBSCRIBE is under way.
	subscribed := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			sa, err := c.Subscribe(sctx, &paho.Subscribe{Subscriptions: subs})
			if err != nil && sa != nil && idInUse(sa.Reasons) && wait.Sleep(sctx, 20*time.Millisecond, nil) {
				// A broker that mixes its packet ids with the client's
				// (mochi does) refuses the SUBSCRIBE when its id is that
				// of a message of the resumed session still in flight.
				// The worker is acknowledging those, and paho takes the
				// next id each time.
				continue
			}
			if err != nil && sa != nil {
				err = fmt.Errorf("%w (reason codes %v)", err, sa.Reasons)
			}
			subscribed <- err
			return
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-subscribed:
			subscribed = nil
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("outbox: subscribe: %w", err)
			}
			s.connected.Store(true)
			s.log.Info("outbox subscriber connected", "broker", redactURL(s.url), "topics", s.opts.Topics, "protocol", "5")
		case err := <-lost:
			return fmt.Errorf("connection lost: %w", err)
		case <-queue.ready:
			for _, m := range queue.take() {
				select {
				case err := <-lost:
					// The rest come again on the next connection.
					return fmt.Errorf("connection lost: %w", err)
				default:
				}
				if !s.process(ctx, m) {
					return nil
				}
			}
		}
	}
}

// queue5 hands messages from paho to the worker without ever blocking
// paho: its reader must go on reading PINGRESPs and the SUBACK while a
// resumed session's backlog is applied. What it holds is what the broker
// sent and paho has read anyway.
type queue5 struct {
	mu    sync.Mutex
	msgs  []*message5
	ready chan struct{} // holds a token while msgs is not empty
}

func (q *queue5) push(m *message5) {
	q.mu.Lock()
	q.msgs = append(q.msgs, m)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take returns the messages queued, in arrival order, and empties q.
func (q *queue5) take() []*message5 {
	q.mu.Lock()
	defer q.mu.Unlock()
	msgs := q.msgs
	q.msgs = nil
	return msgs
}

// idInUse reports whether a SUBACK refused every filter with 0x91,
// "packet identifier in use".
func idInUse(reasons []byte) bool {
	for _, r := range reasons {
		if r != 0x91 {
			return false
		}
	}
	return len(reasons) > 0
}

// dial5 opens the network connection (ALL_PROXY honoured, TLS for a TLS
// URL) before ctx ends.
func (s *Subscriber) dial5(ctx context.Context, tlsCfg *tls.Config) (net.Conn, error) {
	d := &net.Dialer{}
	var raw net.Conn
	var err error
	if cd, ok := netproxy.FromEnvironmentUsing(d).(netproxy.ContextDialer); ok {
		raw, err = cd.DialContext(ctx, "tcp", s.url.Host)
	} else {
		raw, err = d.DialContext(ctx, "tcp", s.url.Host)
	}
	if err != nil || !isTLS(s.url) {
		return raw, err
	}
	if tlsCfg == nil {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if tlsCfg.ServerName == "" {
		tlsCfg = tlsCfg.Clone()
		tlsCfg.ServerName = s.url.Hostname()
	}
	tc := tls.Client(raw, tlsCfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return tc, nil
}

// firstBytes is the connection paho reads, keeping the first bytes read:
// a 3.1.1 broker answers an MQTT 5 CONNECT with a CONNACK of two bytes,
// which paho cannot decode, and those bytes say what it meant.
type firstBytes struct {
	net.Conn
	mu   sync.Mutex
	head []byte
}

func (c *firstBytes) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if len(c.head) < 4 {
		c.head = append(c.head, p[:min(n, 4-len(c.head))]...)
	}
	c.mu.Unlock()
	return n, err
}

// classify turns a failed MQTT 5 connect into what the version choice
// needs: errUnsupportedVersion for a CONNACK that says so (5's 0x84 or a
// 3.1.1 return code 1), a connackError for another refusal, and
// errClosedAfterConnect for a close before any answer.
func (c *firstBytes) classify(ca *paho.Connack, err error) error {
	c.mu.Lock()
	head := append([]byte(nil), c.head...)
	c.mu.Unlock()
	switch {
	case ca != nil && ca.ReasonCode >= 0x80:
		e := &connackError{code: ca.ReasonCode, v5: true}
		if ca.Properties != nil {
			e.reason = ca.Properties.ReasonString
		}
		if ca.ReasonCode == packets.ConnackUnsupportedProtocolVersion {
			return fmt.Errorf("%w: %w", errUnsupportedVersion, e)
		}
		return e
	case len(head) == 4 && head[0] == packets.CONNACK<<4 && head[1] == 2:
		e := &connackError{code: head[3]}
		if e.code == 1 {
			return fmt.Errorf("%w: %w", errUnsupportedVersion, e)
		}
		return e
	case len(head) == 0 && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || isReset(err)):
		return fmt.Errorf("%w: %w", errClosedAfterConnect, err)
	}
	return err
}

// session runs one connection in the version Protocol asks for; auto
// chooses as MQTTPublisher does: 5, and 3.1.1 at once for a broker whose
// CONNACK says it does not speak 5 (for the Subscriber's life), or for
// retry5After after two MQTT 5 CONNECTs in a row closed without a CONNACK.
func (s *Subscriber) session(ctx context.Context) error {
	s.mu.Lock()
	s.at, s.url = s.next, s.urls[s.next]
	s.next = (s.next + 1) % len(s.urls)
	m := &s.mem[s.at]
	s.mu.Unlock()
	switch s.opts.Protocol {
	case Protocol311:
		return s.session311(ctx)
	case Protocol5:
		return s.session5(ctx)
	}
	s.mu.Lock()
	use311 := m.use311(time.Now())
	s.mu.Unlock()
	if use311 {
		return s.session311(ctx)
	}
	err := s.session5(ctx)
	if err == nil {
		return nil // a stop; a connection that spoke 5 was recorded by spoke5
	}
	s.mu.Lock()
	fallback := m.learn(err, time.Now())
	s.mu.Unlock()
	if fallback == "" {
		return err
	}
	s.log.Info("outbox subscriber: "+fallback, "broker", redactURL(s.url), "err", err)
	return s.session311(ctx)
}

// spoke5 records a connection that speaks 5.
func (s *Subscriber) spoke5() {
	s.mu.Lock()
	s.mem[s.at].learn(nil, time.Now())
	s.protocol = "5"
	s.mu.Unlock()
}

// pinger5 keeps an MQTT 5 connection alive and notices a dead one: a
// PINGREQ once nothing was both sent and received for KeepAlive, and the
// connection deemed dead when nothing at all arrives within PingTimeout of
// it. Any packet counts, not only the PINGRESP: behind a resumed session's
// backlog the PINGRESP comes late, on a connection that is plainly alive
// (paho's own pinger gave such connections up).
type pinger5 struct {
	timeout time.Duration

	mu             sync.Mutex
	sent, received time.Time
}

// Run pings until ctx ends or the connection is deemed dead.
func (p *pinger5) Run(ctx context.Context, conn net.Conn, keepAlive uint16) error {
	if keepAlive == 0 {
		return nil
	}
	interval := time.Duration(keepAlive) * time.Second
	p.mu.Lock()
	p.sent, p.received = time.Now(), time.Now()
	p.mu.Unlock()
	t := time.NewTimer(interval)
	defer t.Stop()
	var pinged time.Time // a PINGREQ nothing has arrived since
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		p.mu.Lock()
		sent, received := p.sent, p.received
		p.mu.Unlock()
		now := time.Now()
		if !pinged.IsZero() {
			if !received.After(pinged) {
				if wait := p.timeout - now.Sub(pinged); wait > 0 {
					t.Reset(wait)
					continue
				}
				return fmt.Errorf("nothing from the broker within %s of a PINGREQ", p.timeout)
			}
			pinged = time.Time{}
		}
		due := sent
		if received.Before(due) {
			due = received
		}
		if wait := due.Add(interval).Sub(now); wait > 0 {
			t.Reset(wait)
			continue
		}
		// Before the write: the PINGRESP may be read before it returns.
		pinged = time.Now()
		// A write stuck on a dead link ends when paho closes the
		// connection, which it does before waiting for this to return.
		if _, err := packets.NewControlPacket(packets.PINGREQ).WriteTo(conn); err != nil {
			return fmt.Errorf("PINGREQ: %w", err)
		}
		p.PacketSent()
		t.Reset(p.timeout)
	}
}

// PacketSent notes that a packet left.
func (p *pinger5) PacketSent() {
	p.mu.Lock()
	p.sent = time.Now()
	p.mu.Unlock()
}

// PacketReceived notes that a packet arrived.
func (p *pinger5) PacketReceived() {
	p.mu.Lock()
	p.received = time.Now()
	p.mu.Unlock()
}

// PingResp notes a PINGRESP (PacketReceived has noted it already).
func (p *pinger5) PingResp() {}

// SetDebug is paho's; the pinger logs nothing.
func (p *pinger5) SetDebug(paholog.Logger) {}
