package outboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/edgeoutbox/outbox"
)

// FakeBroker is an in-memory broker for the relay's tests, under the
// test's control: its Publishers (NewPublisher) connect to it, it routes
// what they publish to its subscribers in the order it receives it, and
// acknowledges each publish at once unless told otherwise. Its controls
// are the faults a network and a broker inflict: Cut, Down and Up,
// Withhold and Release, Pause and Resume, Refuse, and a limit on the
// publishes awaiting acknowledgement (FakeBrokerOptions.MaxInFlight).
//
// It behaves as an MQTT broker at QoS 1 would, at the seam (publisher.go):
// a token fails with a *outbox.Refusal for a message refused for itself,
// with outbox.ErrNotConnected for one published without a connection, and
// with an error of the connection's otherwise. It is safe for concurrent
// use and starts no goroutine.
type FakeBroker struct {
	opts FakeBrokerOptions

	mu          sync.Mutex
	subs        []func(FakeMessage)
	conns       []*fakeConn // open, in the order they were made
	refusals    map[string]fakeRefusal
	down        bool
	withholding bool
	paused      bool
	peak        int
	connects    int
}

// FakeBrokerOptions shape a FakeBroker.
type FakeBrokerOptions struct {
	// MaxInFlight is the broker's limit on publishes awaiting their
	// acknowledgement on one connection, which its Publishers tell the
	// relay (outbox.WindowLimiter), as MQTT 5's Receive Maximum; a
	// connection that goes over it is closed, as an MQTT 5 broker does.
	// 0: none.
	MaxInFlight int
	// Properties makes its connections carry outbox.PublishProperties
	// (outbox.PropertiesPublisher), as MQTT 5's do.
	Properties bool
}

// FakeMessage is one message a FakeBroker routed.
type FakeMessage struct {
	Topic   string
	Payload []byte
	// Properties are the message's, on a broker that carries them; nil
	// otherwise.
	Properties *outbox.PublishProperties
}

// Event decodes the message's event, with its properties where it has
// them (outbox.DecodeEventMQTT).
func (m FakeMessage) Event() (outbox.Event, error) {
	if m.Properties != nil {
		return outbox.DecodeEventMQTT(m.Payload, m.Properties.ContentType, m.Properties.User)
	}
	return outbox.DecodeEvent(m.Payload)
}

type fakeRefusal struct {
	mode   RefusalMode
	reason string
}

// fakeConn is one connection of a FakePublisher.
type fakeConn struct {
	lost   chan struct{} // closed when the connection ends
	closed bool
	limit  int
	// queued are publishes the broker has not received yet (paused);
	// withheld, publishes it received whose acknowledgement it holds back.
	// Both await their acknowledgement, in publish order.
	queued, withheld []*fakeToken
}

func (c *fakeConn) inFlight() int { return len(c.queued) + len(c.withheld) }

// NewFakeBroker returns a broker that accepts connections.
func NewFakeBroker(opts FakeBrokerOptions) *FakeBroker {
	return &FakeBroker{opts: opts, refusals: map[string]fakeRefusal{}}
}

// NewPublisher returns a Publisher to b, not connected.
func (b *FakeBroker) NewPublisher() *FakePublisher { return &FakePublisher{b: b} }

// Subscribe has fn called with every message b routes from now on, one
// call at a time, in the order b received them. fn is called with b's lock
// held: it must not call b.
func (b *FakeBroker) Subscribe(fn func(FakeMessage)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.subs = append(b.subs, fn)
}

// Refuse makes b refuse every publish to topic from now on, as mode says:
// RefusedForGood and RefusedForNow fail its token with a *outbox.Refusal
// of reason (permanent for the first) on a connection kept;
// RefusedByClosing closes the connection, its error saying reason;
// AckedAndDropped acknowledges it and routes it nowhere.
func (b *FakeBroker) Refuse(topic string, mode RefusalMode, reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refusals[topic] = fakeRefusal{mode, reason}
}

// Cut closes every connection now: the publishes awaiting their
// acknowledgement fail, withheld or paused. It ends Withhold, not Pause.
// New connections are accepted.
func (b *FakeBroker) Cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.withholding = false
	b.cutLocked(errors.New("outboxtest: connection lost"))
}

func (b *FakeBroker) cutLocked(err error) {
	for _, c := range slices.Clone(b.conns) {
		b.closeLocked(c, err)
	}
}

// Down cuts every connection and refuses new ones until Up.
func (b *FakeBroker) Down() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = true
	b.withholding = false
	b.cutLocked(errors.New("outboxtest: connection lost: the broker went down"))
}

// Up accepts connections again after Down.
func (b *FakeBroker) Up() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = false
}

// Withhold holds back the acknowledgement of every publish b receives from
// now on, until Release acknowledges them or Cut fails them; the messages
// are routed meanwhile.
func (b *FakeBroker) Withhold() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.withholding = true
}

// Release acknowledges up to n withheld publishes, in the order b received
// them, connection by connection, and returns how many it acknowledged.
// Publishes received after it are still withheld, until Cut.
func (b *FakeBroker) Release(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	done := 0
	for _, c := range b.conns {
		for len(c.withheld) > 0 && done < n {
			c.withheld[0].complete(nil)
			c.withheld = c.withheld[1:]
			done++
		}
	}
	return done
}

// Withheld is how many publishes await a withheld acknowledgement.
func (b *FakeBroker) Withheld() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, c := range b.conns {
		n += len(c.withheld)
	}
	return n
}

// Pause holds every publish on its way to b, unreceived and
// unacknowledged, until Resume; nothing is lost unless the connection is.
func (b *FakeBroker) Pause() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.paused = true
}

// Resume lets the publishes held by Pause reach b, in order, and new ones
// through.
func (b *FakeBroker) Resume() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.paused = false
	for _, c := range slices.Clone(b.conns) {
		queued := c.queued
		c.queued = nil
		for _, tok := range queued {
			if c.closed {
				tok.complete(errors.New("outboxtest: connection lost"))
				continue
			}
			b.receiveLocked(c, tok)
		}
	}
}

// PeakInFlight is the most publishes that awaited their acknowledgement
// at once on one connection of b.
func (b *FakeBroker) PeakInFlight() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peak
}

// Connects is how many connections b accepted.
func (b *FakeBroker) Connects() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.connects
}

// closeLocked ends c: what awaits its acknowledgement fails with err.
func (b *FakeBroker) closeLocked(c *fakeConn, err error) {
	if c.closed {
		return
	}
	c.closed = true
	close(c.lost)
	for _, tok := range c.queued {
		tok.complete(err)
	}
	for _, tok := range c.withheld {
		tok.complete(err)
	}
	c.queued, c.withheld = nil, nil
	b.conns = slices.DeleteFunc(b.conns, func(o *fakeConn) bool { return o == c })
}

// publishLocked takes one publish on c.
func (b *FakeBroker) publishLocked(c *fakeConn, tok *fakeToken) {
	if c.limit > 0 && c.inFlight() >= c.limit {
		err := fmt.Errorf("outboxtest: the broker closed the connection: more than its limit of %d publishes awaiting acknowledgement", c.limit)
		tok.complete(err)
		b.closeLocked(c, err)
		return
	}
	if b.paused {
		c.queued = append(c.queued, tok)
		b.peak = max(b.peak, c.inFlight())
		return
	}
	b.receiveLocked(c, tok)
}

// receiveLocked is b receiving one publish on c: refused, or routed and
// acknowledged (or its acknowledgement withheld).
func (b *FakeBroker) receiveLocked(c *fakeConn, tok *fakeToken) {
	b.peak = max(b.peak, c.inFlight()+1)
	route := true
	if r, ok := b.refusals[tok.msg.Topic]; ok {
		switch r.mode {
		case RefusedForGood, RefusedForNow:
			tok.complete(&outbox.Refusal{Reason: r.reason, Permanent: r.mode == RefusedForGood})
			return
		case RefusedByClosing:
			err := fmt.Errorf("outboxtest: the broker closed the connection: %s", r.reason)
			tok.complete(err)
			b.closeLocked(c, err)
			return
		case AckedAndDropped:
			route = false
		}
	}
	if route {
		for _, fn := range b.subs {
			fn(tok.msg)
		}
	}
	if b.withholding {
		c.withheld = append(c.withheld, tok)
		return
	}
	tok.complete(nil)
}

// FakePublisher is a FakeBroker's Publisher, one connection at a time. It
// has the capabilities of outbox.PropertiesPublisher (carrying properties
// where its broker does), outbox.WindowLimiter and
// outbox.ConnectionWatcher.
type FakePublisher struct {
	b    *FakeBroker
	conn *fakeConn // under b.mu
}

// The capabilities of the seam that FakePublisher has.
var (
	_ outbox.Publisher           = (*FakePublisher)(nil)
	_ outbox.PropertiesPublisher = (*FakePublisher)(nil)
	_ outbox.WindowLimiter       = (*FakePublisher)(nil)
	_ outbox.ConnectionWatcher   = (*FakePublisher)(nil)
)

// Connect opens a new connection, unless the broker is down.
func (p *FakePublisher) Connect(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return errors.New("outboxtest: connection refused: the broker is down")
	}
	if p.conn != nil {
		b.closeLocked(p.conn, errors.New("outboxtest: connection replaced"))
	}
	p.conn = &fakeConn{lost: make(chan struct{}), limit: b.opts.MaxInFlight}
	b.conns = append(b.conns, p.conn)
	b.connects++
	return nil
}

// Publish sends one message.
func (p *FakePublisher) Publish(topic string, payload []byte) outbox.Token {
	return p.publish(topic, payload, nil)
}

// PublishWithProperties sends one message with properties; on a broker
// that does not carry them, they are left out.
func (p *FakePublisher) PublishWithProperties(topic string, payload []byte, props outbox.PublishProperties) outbox.Token {
	return p.publish(topic, payload, &props)
}

func (p *FakePublisher) publish(topic string, payload []byte, props *outbox.PublishProperties) outbox.Token {
	b := p.b
	tok := &fakeToken{done: make(chan struct{}), msg: FakeMessage{Topic: topic, Payload: bytes.Clone(payload)}}
	if b.opts.Properties {
		if props == nil {
			props = &outbox.PublishProperties{}
		}
		cp := *props
		cp.User = slices.Clone(props.User)
		tok.msg.Properties = &cp
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case p.conn == nil:
		tok.complete(outbox.ErrNotConnected)
	case p.conn.closed:
		tok.complete(errors.New("outboxtest: connection lost"))
	default:
		b.publishLocked(p.conn, tok)
	}
	return tok
}

// CarriesProperties reports whether the connection carries properties:
// whether it is up, on a broker that carries them.
func (p *FakePublisher) CarriesProperties() bool {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	return p.b.opts.Properties && p.conn != nil && !p.conn.closed
}

// Disconnect closes the connection; what awaits its acknowledgement fails.
func (p *FakePublisher) Disconnect() {
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if p.conn != nil {
		b.closeLocked(p.conn, errors.New("outboxtest: disconnected"))
		p.conn = nil
	}
}

// MaxInFlight is the broker's limit on the current connection; 0: none.
func (p *FakePublisher) MaxInFlight() int {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if p.conn == nil {
		return 0
	}
	return p.conn.limit
}

// ConnectionLost returns a channel closed when the current connection
// ends; nil while there is none.
func (p *FakePublisher) ConnectionLost() <-chan struct{} {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	return p.conn.lost
}

// fakeToken is one publish of a FakePublisher.
type fakeToken struct {
	done chan struct{}
	err  error
	msg  FakeMessage
}

func (t *fakeToken) Done() <-chan struct{} { return t.done }
func (t *fakeToken) Error() error          { return t.err }

// complete is called once, with the broker's lock held.
func (t *fakeToken) complete(err error) {
	t.err = err
	close(t.done)
}
