package mqtt

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	paholog "github.com/eclipse/paho.golang/paho/log"

	"github.com/edgeoutbox/outbox/internal/wait"
)

// The subscriber's MQTT 5 session: paho.golang's Client over a connection
// of ours (dial), a persistent session, QoS 1, and manual acknowledgement:
// a PUBACK only once the handler is done with the message.

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

// message5 is a message received over MQTT 5, as the worker acknowledges
// it.
type message5 struct {
	pb      *paho.Publish
	c       *paho.Client
	lastAck *atomic.Int64 // when an Ack was last made (Unix ns), for the stop
}

// Ack marks the message acknowledged; paho sends the PUBACK within
// ackInterval. Its error (the connection is gone) means the message comes
// again, which the inbox recognises.
func (m *message5) Ack() {
	_ = m.c.Ack(m.pb)
	m.lastAck.Store(time.Now().UnixNano())
}

// message is m as Subscribe hands it over.
func (m *message5) message() Message {
	msg := Message{Topic: m.pb.Topic, Payload: m.pb.Payload, ack: m}
	if p := m.pb.Properties; p != nil {
		msg.ContentType = p.ContentType
		msg.ResponseTopic, msg.CorrelationData = p.ResponseTopic, p.CorrelationData
		if p.MessageExpiry != nil {
			// 0 is what a broker sends with less than a second left: the
			// message ends now, which is not "no expiry".
			msg.MessageExpiry = max(time.Duration(*p.MessageExpiry)*time.Second, time.Nanosecond)
		}
		if len(p.User) > 0 {
			msg.User = make([]UserProperty, len(p.User))
			for i, u := range p.User {
				msg.User[i] = UserProperty{u.Key, u.Value}
			}
		}
	}
	return msg
}

// session5 runs one MQTT 5 session (Subscribe). An error wrapping
// ErrUnsupportedVersion or ErrClosedAfterConnect says the broker may not
// speak 5 (Brokers.Connect chooses the version).
func session5(ctx context.Context, a *Attempt, o *SessionOptions, handle func(context.Context, Message) bool) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tlsCfg, err := tlsConfigFor(o.TLSConfig, o.TLSFiles)
	if err != nil {
		return err
	}
	// ConnectTimeout bounds the dial and the CONNACK together.
	cctx, cancelConnect := context.WithTimeout(sctx, o.ConnectTimeout)
	defer cancelConnect()
	raw, err := dialer{tls: tlsCfg}.dial(cctx, a.URL)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("outbox: subscriber mqtt 5 connect: %s: %w", explain(err, time.Now()), err)
	}
	conn := &firstBytes{Conn: raw, check: publishCheck{max: o.maxPacket()}}
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
		ClientID:                   o.ClientID,
		Conn:                       packets.NewThreadSafeConn(conn),
		PacketTimeout:              o.ConnectTimeout,
		PingHandler:                &pinger5{timeout: o.PingTimeout},
		EnableManualAcknowledgment: true,
		SendAcksInterval:           ackInterval,
		// paho calls this from one goroutine, in arrival order.
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			queue.push(&message5{pb: pr.Packet, c: pr.Client, lastAck: &lastAck})
			return true, nil
		}},
		OnClientError: setLost,
		OnServerDisconnect: func(d *paho.Disconnect) {
			e := &DisconnectError{Code: d.ReasonCode}
			if d.Properties != nil {
				e.Reason = d.Properties.ReasonString
			}
			setLost(e)
		},
	})
	// No Receive Maximum (65,535, as good as none): mochi, given one
	// lower than a resumed session's backlog, writes the messages beyond
	// it and forgets them at once, so a connection lost then loses them.
	expiry := uint32(sessionNeverExpires)
	maxPacket := uint32(o.maxPacket())
	cp := &paho.Connect{
		ClientID:   o.ClientID,
		KeepAlive:  uint16(min(o.KeepAlive/time.Second, 65535)),
		CleanStart: o.CleanSession,
		// RequestProblemInfo true is MQTT's default (paho would send 0):
		// mochi, told 0, strips the user properties from every PUBLISH
		// it delivers, and CloudEvents binary mode's attributes with them.
		// MaximumPacketSize has the broker drop a message too large for
		// the check on the stream (firstBytes) instead of sending it.
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry, RequestProblemInfo: true,
			MaximumPacketSize: &maxPacket},
	}
	if o.CleanSession {
		// No Session Expiry Interval is 0: the session ends with the
		// connection.
		cp.Properties.SessionExpiryInterval = nil
	}
	if o.Username != "" {
		cp.UsernameFlag, cp.Username = true, o.Username
		cp.PasswordFlag, cp.Password = true, []byte(o.Password)
	}
	ca, err := c.Connect(cctx, cp)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		err = conn.classify(ca, conn.check.because(err))
		return fmt.Errorf("outbox: subscriber mqtt 5 connect: %s: %w", explain(err, time.Now()), err)
	}
	a.Connected()
	o.connected("5")
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
	subs := make([]paho.SubscribeOptions, len(o.Topics))
	for i, t := range o.Topics {
		subs[i] = paho.SubscribeOptions{Topic: t, QoS: 1}
	}
	// A resumed session's messages come before the SUBACK: they are
	// handled while the SUBSCRIBE is under way.
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
				return fmt.Errorf("outbox: subscribe: %w", conn.check.because(err))
			}
			o.subscribed(a, "5")
		case err := <-lost:
			return fmt.Errorf("connection lost: %w", conn.check.because(err))
		case <-queue.ready:
			for _, m := range queue.take() {
				select {
				case err := <-lost:
					// The rest come again on the next connection.
					return fmt.Errorf("connection lost: %w", conn.check.because(err))
				default:
				}
				if !handle(ctx, m.message()) {
					return nil
				}
			}
		}
	}
}

// queue5 hands messages from paho to the worker without ever blocking
// paho: its reader must go on reading PINGRESPs and the SUBACK while a
// resumed session's backlog is handled. What it holds is what the broker
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

// firstBytes is the connection paho reads, keeping the first bytes read:
// a 3.1.1 broker answers an MQTT 5 CONNECT with a CONNACK of two bytes,
// which paho cannot decode, and those bytes say what it meant. It also
// checks each packet's size and each PUBLISH's properties before paho has
// the whole packet (publishCheck).
type firstBytes struct {
	net.Conn
	mu    sync.Mutex
	head  []byte
	check publishCheck // paho's one reader calls Read: no lock needed
}

func (c *firstBytes) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if len(c.head) < 4 {
		c.head = append(c.head, p[:min(n, 4-len(c.head))]...)
	}
	c.mu.Unlock()
	if cerr := c.check.scan(p[:n]); cerr != nil {
		return 0, cerr
	}
	return n, err
}

// classify turns a failed MQTT 5 connect into what the version choice
// needs: ErrUnsupportedVersion for a CONNACK that says so (5's 0x84 or a
// 3.1.1 return code 1), a ConnackError for another refusal, and
// ErrClosedAfterConnect for a close before any answer.
func (c *firstBytes) classify(ca *paho.Connack, err error) error {
	c.mu.Lock()
	head := append([]byte(nil), c.head...)
	c.mu.Unlock()
	switch {
	case ca != nil && ca.ReasonCode >= 0x80:
		e := &ConnackError{Code: ca.ReasonCode, V5: true}
		if ca.Properties != nil {
			e.Reason = ca.Properties.ReasonString
		}
		if ca.ReasonCode == packets.ConnackUnsupportedProtocolVersion {
			return fmt.Errorf("%w: %w", ErrUnsupportedVersion, e)
		}
		return e
	case len(head) == 4 && head[0] == packets.CONNACK<<4 && head[1] == 2:
		e := &ConnackError{Code: head[3]}
		if e.Code == 1 {
			return fmt.Errorf("%w: %w", ErrUnsupportedVersion, e)
		}
		return e
	case len(head) == 0 && closedEarly(err):
		return fmt.Errorf("%w: %w", ErrClosedAfterConnect, err)
	}
	return err
}

// pinger5 is paho.golang's PingHandler for the subscriber: it keeps the
// connection alive and notices a dead one. A PINGREQ goes once nothing was
// both sent and received for KeepAlive, and the connection is deemed dead
// when nothing at all arrives within PingTimeout of it. Any packet counts,
// not only the PINGRESP: behind a resumed session's backlog the PINGRESP
// comes late, on a connection that is plainly alive (paho's own pinger gave
// such connections up).
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
		if _, err := conn.Write(pingreq); err != nil {
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
