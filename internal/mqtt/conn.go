package mqtt

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Conn is one publish connection to the broker, MQTT 5 or 3.1.1, at QoS 1:
// one writer that sends publishes in hand-off order, several to a write,
// one reader that completes their tokens as the PUBACKs come, matched by
// packet id, and one pinger. It uses neither paho client: paho.golang's
// Client's Publish waits for the PUBACK, so a window of publishes would
// need a goroutine each, with nothing to keep them in order on the connection;
// paho.mqtt.golang's client passes every publish and its PUBACK through
// goroutines of its own, and its Publish blocks for the write timeout once
// the connection is lost. The reader decodes what a broker sends it by
// each version's rules itself (inbound.go), and the writer encodes the
// PUBLISH (frames.go); paho.golang's packets does the MQTT 5 handshake and
// paho.mqtt.golang's the 3.1.1 CONNECT (connect.go).
//
// A Conn never reconnects: the caller opens a new one.
type Conn struct {
	wg       *sync.WaitGroup
	log      *slog.Logger
	classify func(error) error // Options.Classify; nil: errors as they are
	since    time.Time         // when it connected
	conn     net.Conn          // what MQTT is written to (TLS or the link)
	link     *link
	// v311: the connection speaks MQTT 3.1.1; else 5.
	v311      bool
	keepAlive time.Duration
	pingWait  time.Duration
	// receiveMax and maxPacket are the broker's, from the CONNACK (0: no
	// limit).
	receiveMax int
	maxPacket  int

	queue    chan *PublishToken
	answers  chan uint16 // PUBLISHes the broker sent, to acknowledge
	pingresp chan struct{}
	lost     chan struct{}
	stop     chan struct{}

	wmu       sync.Mutex // one packet at a time on the connection
	lastWrite time.Time  // under wmu
	wbuf      []byte     // under wmu: PUBLISHes, encoded

	mu      sync.Mutex
	closed  bool
	lostErr error // why it ended, when it broke
	nextID  uint16
	pending map[uint16]*PublishToken
	queued  map[*PublishToken]struct{} // handed over, not yet written
}

// Options configure a publish connection (Open).
type Options struct {
	// ClientID, Username and Password go in the CONNECT.
	ClientID, Username, Password string
	// TLSConfig is used for a TLS URL; TLSFiles, if set, replaces it and
	// is read again for every connection.
	TLSConfig *tls.Config
	TLSFiles  *TLSFiles
	// ConnectTimeout bounds the dial and the TLS handshake, and again the
	// CONNECT and its CONNACK; WriteTimeout is the longest a write may go
	// without moving a byte.
	ConnectTimeout, WriteTimeout time.Duration
	// KeepAlive is the MQTT keepalive (an MQTT 5 broker may set another),
	// and PingTimeout how long a PINGRESP may take once its PINGREQ left.
	KeepAlive, PingTimeout time.Duration
	// Logger gets the connection's debug notes.
	Logger *slog.Logger
	// Control, if set, is given every socket before it connects.
	Control func(network, address string, c syscall.RawConn) error
	// Classify, if set, is applied once to the error of every token that
	// fails: it turns what this package reports (PubackError,
	// PacketTooLargeError, StallError, ErrNotConnected, a lost connection)
	// into what the caller's tokens say, without a wrapper per publish.
	Classify func(error) error
	// Goroutines, if set, counts the connection's goroutines, so that the
	// caller can wait for them to end after Close.
	Goroutines *sync.WaitGroup
}

// Token tracks one publish: Done is closed when it completed or failed, and
// Error is then valid. The token of a publish handed to the writer is a
// *PublishToken, which can tell its progress too.
type Token interface {
	Done() <-chan struct{}
	Error() error
}

// What a failed publish reports, besides PubackError (reasoncode.go).
var (
	// ErrNotConnected: the publish was never written, there being no
	// connection (any more).
	ErrNotConnected = errors.New("not connected")
	// ErrDisconnected is wrapped by the error of every publish in flight
	// when its connection ended, with why it ended.
	ErrDisconnected = errors.New("disconnected before the acknowledgement")
	// ErrPingTimeout is why a connection ended whose PINGRESP did not come
	// within PingTimeout of the PINGREQ leaving this host.
	ErrPingTimeout = errors.New("no PINGRESP within the ping timeout")
)

// NotConnectedError is ErrNotConnected (errors.Is says so) for a publish
// not written because its connection had ended, with why it ended.
type NotConnectedError struct {
	Cause error // why the connection ended
}

// Error says that the publish was not sent, and why.
func (e *NotConnectedError) Error() string { return ErrNotConnected.Error() + ": " + e.Cause.Error() }

// Is makes it ErrNotConnected.
func (e *NotConnectedError) Is(target error) bool { return target == ErrNotConnected }

// Unwrap is why the connection ended.
func (e *NotConnectedError) Unwrap() error { return e.Cause }

// notConnected is the error of a publish not written on the connection,
// closed: with why it ended, if it broke. Under mu.
func (c *Conn) notConnected() error {
	if c.lostErr != nil {
		return &NotConnectedError{Cause: c.lostErr}
	}
	return ErrNotConnected
}

// PacketTooLargeError is a publish not sent because its packet would be over
// the broker's Maximum Packet Size (MQTT 5's CONNACK): the broker would
// close the connection for it.
type PacketTooLargeError struct {
	Size int // the PUBLISH packet's bytes
	Max  int // the broker's Maximum Packet Size
}

// Error says both sizes, and that the message was not sent.
func (e *PacketTooLargeError) Error() string {
	return fmt.Sprintf("packet too large: the message is %d bytes as an MQTT packet, over the broker's Maximum Packet Size of %d (not sent)", e.Size, e.Max)
}

// StallError is the failure of a publish whose connection was given up for
// moving no bytes (a write or a ping that made no progress) before the
// packet had left this host: nothing says the broker refused it, or even
// saw it.
type StallError struct {
	Err error // why the connection ended
}

// Error says what a stall is, then why the connection ended.
func (e *StallError) Error() string {
	return "the connection moved no bytes before the message had left: " + e.Err.Error()
}

// Unwrap is why the connection ended.
func (e *StallError) Unwrap() error { return e.Err }

// newConn is a connection that has just been acknowledged (CONNACK), in
// either version; not yet started.
func newConn(conn net.Conn, l *link, v311 bool, o *Options) *Conn {
	wg := o.Goroutines
	if wg == nil {
		wg = new(sync.WaitGroup)
	}
	return &Conn{
		wg:        wg,
		log:       o.Logger,
		classify:  o.Classify,
		since:     time.Now(),
		conn:      conn,
		link:      l,
		v311:      v311,
		keepAlive: o.KeepAlive,
		pingWait:  o.PingTimeout,
		queue:     make(chan *PublishToken, 64),
		answers:   make(chan uint16, 16),
		pingresp:  make(chan struct{}, 1),
		lost:      make(chan struct{}),
		stop:      make(chan struct{}),
		pending:   make(map[uint16]*PublishToken),
		queued:    make(map[*PublishToken]struct{}),
		lastWrite: time.Now(),
	}
}

// start runs the connection's goroutines.
func (c *Conn) start() {
	c.wg.Add(3)
	go func() { defer c.wg.Done(); c.write() }()
	go func() { defer c.wg.Done(); c.read() }()
	go func() { defer c.wg.Done(); c.ping() }()
}

// V5 reports whether the connection speaks MQTT 5 (else 3.1.1).
func (c *Conn) V5() bool { return !c.v311 }

// ReceiveMaximum is how many publishes the broker lets await their PUBACK
// (MQTT 5's Receive Maximum); 0 if it set no limit or speaks 3.1.1.
func (c *Conn) ReceiveMaximum() int { return c.receiveMax }

// Lost is closed when the connection breaks or the broker ends it; not when
// Close ends it.
func (c *Conn) Lost() <-chan struct{} { return c.lost }

// Publish hands one message over to the writer, at QoS 1, and returns its
// token. props are copied; on 3.1.1 they are left out.
func (c *Conn) Publish(topic string, payload []byte, props *Properties) Token {
	if c.v311 {
		props = nil
	}
	if c.maxPacket > 0 {
		rem := RemainingLength(topic, len(payload), props, !c.v311)
		if n := 1 + varintSize(rem) + rem; n > c.maxPacket {
			return c.failed(&PacketTooLargeError{Size: n, Max: c.maxPacket})
		}
	}
	t := &PublishToken{topic: topic, payload: payload, done: make(chan struct{}), c: c}
	if props != nil {
		t.props = *props
	}
	c.mu.Lock()
	if c.closed {
		err := c.notConnected()
		c.mu.Unlock()
		return c.failed(err)
	}
	c.queued[t] = struct{}{}
	c.mu.Unlock()
	select {
	case c.queue <- t:
	case <-c.stop:
		c.mu.Lock()
		delete(c.queued, t)
		err := c.notConnected()
		c.mu.Unlock()
		t.complete(err)
	}
	return t
}

// failed is the token of a publish that failed before it was handed over.
func (c *Conn) failed(err error) Token {
	if c.classify != nil {
		err = c.classify(err)
	}
	return failedToken{err}
}

// write sends publishes in hand-off order, each under a packet id of its
// own. What has been handed over by the time it writes goes in the same
// write, up to coalesceMessages and coalesceBytes: a window refilled by a
// burst of PUBACKs costs one system call, not one per message.
func (c *Conn) write() {
	batch := make([]*PublishToken, 0, coalesceMessages)
	ids := make([]uint16, 0, coalesceMessages)
	ends := make([]int64, 0, coalesceMessages)
	plain := c.conn == net.Conn(c.link) // no TLS: the link carries the packets as they are
	for {
		var t *PublishToken
		select {
		case <-c.stop:
			return
		case t = <-c.queue:
		case id := <-c.answers:
			if !c.answer(id) {
				return
			}
			continue
		}
		batch = append(batch[:0], t)
		size := len(t.payload)
	more:
		for len(batch) < coalesceMessages && size < coalesceBytes {
			select {
			case t = <-c.queue:
				batch = append(batch, t)
				size += len(t.payload)
			default:
				break more
			}
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		ids = ids[:0]
		for _, t := range batch {
			id := c.allocate()
			delete(c.queued, t)
			c.pending[id] = t
			ids = append(ids, id)
		}
		c.mu.Unlock()
		c.wmu.Lock()
		c.link.armed.Store(true)
		c.wbuf, ends = c.wbuf[:0], ends[:0]
		for i, t := range batch {
			if c.v311 {
				c.wbuf = appendPublish311(c.wbuf, t.topic, ids[i], t.payload)
			} else {
				c.wbuf = appendPublish5(c.wbuf, t.topic, ids[i], t.payload, &t.props)
			}
			t.payload, t.props = nil, Properties{}
			ends = append(ends, int64(len(c.wbuf)))
		}
		base := c.link.written.Load()
		_, err := c.conn.Write(c.wbuf)
		c.link.armed.Store(false)
		c.lastWrite = time.Now()
		c.wmu.Unlock()
		if err != nil {
			c.fail(fmt.Errorf("outbox: mqtt: write: %w", err))
			return
		}
		// Where each packet ends on the link; under TLS, whose records
		// the link carries, the write's end stands for each of its packets.
		end := c.link.written.Load()
		for i, t := range batch {
			if plain {
				t.end.Store(base + ends[i])
			} else {
				t.end.Store(end)
			}
			batch[i] = nil
		}
		if cap(c.wbuf) > 1<<20 {
			c.wbuf = nil // not kept for the next small one
		}
	}
}

// answer acknowledges a QoS 1 PUBLISH the broker sent (MQTT wants it
// acknowledged; the publisher drops it). false: the connection failed.
func (c *Conn) answer(id uint16) bool {
	c.wmu.Lock()
	c.link.armed.Store(true)
	_, err := c.conn.Write([]byte{typePuback << 4, 2, byte(id >> 8), byte(id)})
	c.link.armed.Store(false)
	c.lastWrite = time.Now()
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("outbox: mqtt: write: %w", err))
		return false
	}
	return true
}

// At most this many publishes, and about this many payload bytes, go in one
// write.
const (
	coalesceMessages = 64
	coalesceBytes    = 64 << 10
)

// allocate returns a packet id not in use; the window is far below 65,535.
func (c *Conn) allocate() uint16 {
	for {
		c.nextID++
		if c.nextID == 0 {
			c.nextID = 1
		}
		if _, used := c.pending[c.nextID]; !used {
			return c.nextID
		}
	}
}

// read completes tokens as their PUBACKs come (through the link's read
// buffer), each packet read by the rules of the connection's version
// (inbound.go), without allocating for a PUBACK. A packet that breaks them
// ends the connection with a ProtocolError.
func (c *Conn) read() {
	buf := make([]byte, 0, 64)
	for {
		first, body, err := readFrame(c.conn, buf, c.v311)
		if err != nil {
			c.fail(err)
			return
		}
		if cap(body) > cap(buf) {
			buf = body[:0] // kept for the next one: at most MaxInboundPacket
		}
		in, err := decodeInbound(c.v311, first, body)
		if err != nil {
			c.fail(err)
			return
		}
		switch in.kind {
		case typePuback:
			if err := c.puback(in.id, in.code, in.reason); err != nil {
				c.fail(err)
				return
			}
		case typePingresp:
			select {
			case c.pingresp <- struct{}{}:
			default:
			}
		case typeDisconnect:
			c.fail(&DisconnectError{Code: in.code, Reason: in.reason})
			return
		case typePublish:
			if in.id == 0 {
				continue // QoS 0: nothing to answer
			}
			select {
			case c.answers <- in.id:
			case <-c.stop:
				return
			}
		}
	}
}

// puback completes the token a PUBACK is for: with a PubackError for a
// reason code of 0x80 or more. A PUBACK for no publish in flight (unknown,
// or a second one) is a ProtocolError: a broker that confuses packet ids
// could acknowledge a message it never got once its id is used again.
func (c *Conn) puback(id uint16, code byte, reason string) error {
	c.mu.Lock()
	t := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if t == nil {
		return protocolError(c.v311, "a PUBACK for packet id %d, which no publish in flight has", id)
	}
	var err error
	if code >= 0x80 {
		err = &PubackError{Code: code, Reason: reason}
	}
	t.settle(code, err)
	return nil
}

// ping keeps the connection alive and notices a dead one: a PINGREQ after
// KeepAlive without writing; no PINGRESP within PingTimeout of its leaving
// this host ends the connection.
func (c *Conn) ping() {
	if c.keepAlive <= 0 {
		return
	}
	t := time.NewTimer(c.keepAlive)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.wmu.Lock()
		idle := time.Since(c.lastWrite)
		if idle < c.keepAlive {
			c.wmu.Unlock()
			t.Reset(c.keepAlive - idle)
			continue
		}
		select {
		case <-c.pingresp: // a stale one
		default:
		}
		_, err := c.conn.Write(pingreq)
		c.lastWrite = time.Now()
		end := c.link.written.Load()
		c.wmu.Unlock()
		if err != nil {
			c.fail(fmt.Errorf("outbox: mqtt: ping: %w", err))
			return
		}
		// On a slow link the PINGREQ waits behind the bytes before it:
		// its timeout counts from when it has left.
		c.link.awaitGone(end, c.pingWait, c.stop)
		wait := time.NewTimer(c.pingWait)
		select {
		case <-c.pingresp:
			wait.Stop()
		case <-c.stop:
			wait.Stop()
			return
		case <-wait.C:
			c.fail(fmt.Errorf("%w (%s)", ErrPingTimeout, c.pingWait))
			return
		}
		t.Reset(c.keepAlive)
	}
}

// fail ends a connection that broke (or that the broker ended).
func (c *Conn) fail(err error) {
	c.mu.Lock()
	first := !c.closed && c.lostErr == nil
	if first {
		c.lostErr = err
	}
	c.mu.Unlock()
	if first {
		gone, moved := c.link.progress()
		c.log.Debug("outbox mqtt: connection ended", "err", err, "after", time.Since(c.since).Round(time.Millisecond),
			"written", c.link.written.Load(), "gone", gone, "last_moved", time.Since(moved).Round(time.Millisecond))
	}
	c.shut(false)
}

// LostReason is why the connection ended, when more is known than that it
// broke: the broker's DISCONNECT (MQTT 5, a *DisconnectError), a
// *ProtocolError, or a ping timeout (ErrPingTimeout); nil otherwise.
func (c *Conn) LostReason() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var de *DisconnectError
	var pe *ProtocolError
	switch {
	case errors.As(c.lostErr, &de):
		return de
	case errors.As(c.lostErr, &pe), errors.Is(c.lostErr, ErrPingTimeout):
		return c.lostErr
	}
	return nil
}

// Close closes the connection at once; tokens in flight fail. The
// DISCONNECT goes in the background, bounded, and the socket is closed
// after it: Options.Goroutines counts that goroutine too.
func (c *Conn) Close() { c.shut(true) }

// shut closes the connection once; tokens in flight fail at once. A close
// asked for sends a DISCONNECT first, in the background: nothing more may be
// acknowledged on this connection.
func (c *Conn) shut(asked bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	close(c.stop)
	if !asked {
		close(c.lost)
	}
	cause := error(ErrDisconnected)
	if c.lostErr != nil {
		cause = fmt.Errorf("%w: %w", ErrDisconnected, c.lostErr)
	}
	pending, queued := c.pending, c.queued
	c.pending, c.queued = nil, nil
	notSent := c.notConnected()
	c.mu.Unlock()
	for _, t := range pending {
		t.complete(t.stall(cause))
	}
	for t := range queued {
		t.complete(notSent)
	}
	if !asked {
		c.conn.Close()
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if c.wmu.TryLock() {
			c.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			if c.v311 {
				c.conn.Write(disconnect311)
			} else {
				c.conn.Write(disconnect5)
			}
			c.wmu.Unlock()
		}
		c.conn.Close()
	}()
}

// PublishToken is the token of a publish handed over to the writer.
type PublishToken struct {
	topic   string
	payload []byte
	props   Properties // MQTT 5 only
	done    chan struct{}
	err     error
	code    byte // the PUBACK's reason code, if it came
	once    sync.Once

	c      *Conn
	end    atomic.Int64              // where the packet ends on the link; 0 until written
	leftAt atomic.Pointer[time.Time] // when its last byte was first seen gone
}

// Done is closed when the publish completed or failed.
func (t *PublishToken) Done() <-chan struct{} { return t.done }

// Error is nil once the broker acknowledged the message; valid once Done
// is closed.
func (t *PublishToken) Error() error { return t.err }

// NoSubscribers reports whether the broker acknowledged the message
// saying that no subscription matched its topic (MQTT 5's PUBACK 0x10); a
// 3.1.1 broker never says. Valid once Done is closed.
func (t *PublishToken) NoSubscribers() bool { return t.code == 0x10 }

func (t *PublishToken) complete(err error) { t.settle(0, err) }

// settle completes the token with err, or with the PUBACK reason code
// (below 0x80: success) that came for it.
func (t *PublishToken) settle(code byte, err error) {
	t.once.Do(func() {
		if err != nil && t.c.classify != nil {
			err = t.c.classify(err)
		}
		t.err, t.code = err, code
		close(t.done)
	})
}

// Progress reports whether every byte of the packet has left this host,
// and since when; while it has not, when the connection last moved bytes.
func (t *PublishToken) Progress() (left bool, since time.Time) {
	if at := t.leftAt.Load(); at != nil {
		return true, *at
	}
	gone, moved := t.c.link.progress()
	if end := t.end.Load(); end > 0 && gone >= end {
		now := time.Now()
		t.leftAt.CompareAndSwap(nil, &now)
		return true, *t.leftAt.Load()
	}
	return false, moved
}

// stall makes a StallError of err when the connection was given up for
// moving no bytes before the packet had left.
func (t *PublishToken) stall(err error) error {
	if err == nil || !t.c.link.stalled.Load() {
		return err
	}
	if left, _ := t.Progress(); left {
		return err
	}
	return &StallError{Err: err}
}

// failedToken is a token that failed before anything was sent.
type failedToken struct{ err error }

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (failedToken) Done() <-chan struct{} { return closedChan }
func (t failedToken) Error() error        { return t.err }

// Failed is a token that has failed with err.
func Failed(err error) Token { return failedToken{err} }
