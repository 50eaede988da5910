package outbox

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// mqttConn is one paho client, used for one connection only.
//
// paho's Publish hands each packet to its network goroutine through an
// unbuffered channel; once the connection is lost nobody receives, and
// Publish blocks for the whole WriteTimeout. So publishes go through a
// writer goroutine of our own, and the relay gets a token that Disconnect
// can fail at once.
type mqttConn struct {
	wg      *sync.WaitGroup
	client  mqtt.Client
	wire    *wireConn
	lost    chan struct{}
	queue   chan *pubToken
	forward chan forwarding
	stop    chan struct{}

	mu      sync.Mutex
	closed  bool
	pending map[*pubToken]struct{}
}

type forwarding struct {
	tok  *pubToken
	paho mqtt.Token
}

func (c *mqttConn) publish(topic string, payload []byte) Token {
	t := &pubToken{topic: topic, payload: payload, done: make(chan struct{}), link: c.wire.link}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return failedToken{ErrNotConnected}
	}
	c.pending[t] = struct{}{}
	c.mu.Unlock()
	select {
	case c.queue <- t:
	case <-c.stop:
		c.complete(t, ErrNotConnected)
	}
	return t
}

func (c *mqttConn) complete(t *pubToken, err error) {
	c.mu.Lock()
	delete(c.pending, t)
	c.mu.Unlock()
	t.complete(t.classify(err))
}

// write hands publishes to paho in order.
func (c *mqttConn) write() {
	defer close(c.forward)
	for {
		select {
		case <-c.stop:
			return
		case t := <-c.queue:
			if !c.wire.expect(t, c.stop) {
				return
			}
			pt := c.client.Publish(t.topic, 1, false, t.payload)
			t.payload = nil
			select {
			case <-pt.Done():
				if pt.Error() != nil {
					c.wire.forget(t) // paho never wrote it
				}
			default:
			}
			select {
			case c.forward <- forwarding{t, pt}:
			case <-c.stop:
				return
			}
		}
	}
}

// forwardAcks completes the relay's tokens as paho's complete.
func (c *mqttConn) forwardAcks() {
	for f := range c.forward {
		select {
		case <-f.paho.Done():
			err := f.paho.Error()
			if errors.Is(err, mqtt.ErrNotConnected) {
				err = fmt.Errorf("%w: %w", ErrNotConnected, err)
			}
			c.complete(f.tok, err)
		case <-c.stop:
			return
		}
	}
}

var errDisconnected = errors.New("disconnected before the acknowledgement")

func (c *mqttConn) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	close(c.stop)
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for t := range pending {
		t.complete(t.classify(errDisconnected))
	}
	// Without quiesce: nothing more may be acknowledged on this connection.
	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.client.Disconnect(0) }()
}

// pubToken is the relay's token for one publish.
type pubToken struct {
	topic   string
	payload []byte
	props   *packets.Properties // MQTT 5 only
	done    chan struct{}
	err     error
	once    sync.Once

	link   *linkConn
	end    atomic.Int64              // where the packet ends on the wire; 0 until written
	leftAt atomic.Pointer[time.Time] // when its last byte was first seen gone
}

func (t *pubToken) Done() <-chan struct{} { return t.done }
func (t *pubToken) Error() error          { return t.err }
func (t *pubToken) complete(err error) {
	t.once.Do(func() {
		t.err = err
		close(t.done)
	})
}

// Wire implements wireToken: whether every byte of the packet has left,
// and since when; while it has not, when the connection last moved bytes.
func (t *pubToken) Wire() (left bool, since time.Time) {
	if at := t.leftAt.Load(); at != nil {
		return true, *at
	}
	gone, moved := t.link.progress()
	if end := t.end.Load(); end > 0 && gone >= end {
		now := time.Now()
		t.leftAt.CompareAndSwap(nil, &now)
		return true, *t.leftAt.Load()
	}
	return false, moved
}

// classify marks a failure as a stall when the connection was given up
// for moving no bytes (a write or ping that made no progress) before the
// packet had left: nothing then says the broker refused it.
func (t *pubToken) classify(err error) error {
	if err == nil || !t.link.stalled.Load() {
		return err
	}
	if left, _ := t.Wire(); left {
		return err
	}
	return fmt.Errorf("%w: %w", errStalled, err)
}

// failedToken is a token that failed before anything was sent.
type failedToken struct{ err error }

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (failedToken) Done() <-chan struct{} { return closedChan }
func (t failedToken) Error() error        { return t.err }
