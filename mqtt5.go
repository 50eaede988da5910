package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// MQTTProtocol is the MQTT version an MQTTPublisher speaks.
type MQTTProtocol int

const (
	// ProtocolAuto connects with MQTT 5 and falls back to 3.1.1 for a broker
	// that does not speak 5. The default.
	ProtocolAuto MQTTProtocol = iota
	// Protocol5 is MQTT 5 only: the broker's reason codes decide each
	// message.
	Protocol5
	// Protocol311 is MQTT 3.1.1 only.
	Protocol311
)

// String is the name ParseMQTTProtocol reads: "auto", "5" or "3.1.1".
func (p MQTTProtocol) String() string {
	switch p {
	case ProtocolAuto:
		return "auto"
	case Protocol5:
		return "5"
	case Protocol311:
		return "3.1.1"
	}
	return fmt.Sprintf("MQTTProtocol(%d)", int(p))
}

// ParseMQTTProtocol reads "auto" (or ""), "5" or "3.1.1".
func ParseMQTTProtocol(s string) (MQTTProtocol, error) {
	switch s {
	case "", "auto":
		return ProtocolAuto, nil
	case "5", "5.0":
		return Protocol5, nil
	case "3.1.1", "311", "4":
		return Protocol311, nil
	}
	return 0, fmt.Errorf("outbox: mqtt version %q: want auto, 5 or 3.1.1", s)
}

var (
	// errUnsupportedVersion: the broker answered the MQTT 5 CONNECT with
	// "unsupported protocol version" (5.0 reason 0x84, or a 3.1.1 return
	// code 1).
	errUnsupportedVersion = errors.New("the broker does not speak MQTT 5")
	// errClosedAfterConnect: the broker closed the connection after the
	// MQTT 5 CONNECT without a CONNACK: some 3.1.1 brokers do, and so does
	// an outage.
	errClosedAfterConnect = errors.New("the broker closed the connection without a CONNACK")
)

// mqtt5Conn is one MQTT 5 connection. paho.golang's Client is not used: its
// Publish waits for the PUBACK, so a window needs a goroutine per message,
// and nothing keeps those in order on the wire; nor does its Conn get each
// packet in one write. So this owns the session, as mqttConn does paho's
// 3.1.1 one, with paho.golang's packets package to encode and decode: one
// writer in hand-off order, one reader matching PUBACKs by packet id.
type mqtt5Conn struct {
	wg        *sync.WaitGroup
	log       *slog.Logger
	since     time.Time // when it connected
	conn      net.Conn  // what MQTT is written to (TLS or the link)
	link      *linkConn
	keepAlive time.Duration
	pingWait  time.Duration
	// receiveMax and maxPacket are the broker's, from the CONNACK (0: no
	// limit).
	receiveMax int
	maxPacket  int

	queue    chan *pubToken
	pingresp chan struct{}
	lost     chan struct{}
	stop     chan struct{}

	wmu       sync.Mutex // one packet at a time on the wire
	lastWrite time.Time  // under wmu

	mu      sync.Mutex
	closed  bool
	lostErr error // why the broker ended it, if it said
	nextID  uint16
	pending map[uint16]*pubToken
	queued  map[*pubToken]struct{} // handed over, not yet written
}

// connect5 opens an MQTT 5 connection with a clean start and no session
// kept by the broker.
func (p *MQTTPublisher) connect5(ctx context.Context) (*mqtt5Conn, error) {
	tlsCfg, err := tlsConfigFor(p.opts.TLSConfig, p.opts.TLSFiles)
	if err != nil {
		return nil, err
	}
	conn, link, err := p.dial(p.url, tlsCfg)
	if err != nil {
		return nil, err
	}
	// Until the CONNACK, a cancelled ctx ends the attempt at once.
	stopWatch := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopWatch()
	conn.SetDeadline(time.Now().Add(p.opts.ConnectTimeout))
	cp := packets.NewControlPacket(packets.CONNECT)
	c := cp.Content.(*packets.Connect)
	c.ProtocolName, c.ProtocolVersion, c.CleanStart = "MQTT", 5, true
	c.ClientID = p.opts.ClientID
	c.KeepAlive = uint16(min(p.opts.KeepAlive/time.Second, 65535))
	if p.opts.Username != "" {
		c.UsernameFlag, c.Username = true, p.opts.Username
		c.PasswordFlag, c.Password = true, []byte(p.opts.Password)
	}
	if err := writePacket(conn, cp); err != nil {
		conn.Close()
		return nil, ctxOr(ctx, err)
	}
	ack, err := readPacket(conn)
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ce *connackError
		switch {
		case errors.As(err, &ce):
			return nil, err
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), isReset(err):
			return nil, fmt.Errorf("%w: %w", errClosedAfterConnect, err)
		}
		return nil, err
	}
	ca, ok := ack.Content.(*packets.Connack)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("outbox: mqtt: the broker answered the CONNECT with packet type %d", ack.FixedHeader.Type)
	}
	props := ca.Properties
	if props == nil {
		props = &packets.Properties{}
	}
	if ca.ReasonCode >= 0x80 {
		conn.Close()
		e := &connackError{code: ca.ReasonCode, v5: true, reason: props.ReasonString}
		if ca.ReasonCode == packets.ConnackUnsupportedProtocolVersion {
			return nil, fmt.Errorf("%w: %w", errUnsupportedVersion, e)
		}
		return nil, e
	}
	if props.MaximumQOS != nil && *props.MaximumQOS < 1 {
		conn.Close()
		return nil, fmt.Errorf("outbox: mqtt: the broker allows QoS 0 only, and the outbox publishes at QoS 1")
	}
	conn.SetDeadline(time.Time{})
	cn := &mqtt5Conn{
		wg:        &p.wg,
		log:       p.opts.Logger,
		since:     time.Now(),
		conn:      conn,
		link:      link,
		keepAlive: p.opts.KeepAlive,
		pingWait:  p.opts.PingTimeout,
		queue:     make(chan *pubToken, 64),
		pingresp:  make(chan struct{}, 1),
		lost:      make(chan struct{}),
		stop:      make(chan struct{}),
		pending:   make(map[uint16]*pubToken),
		queued:    make(map[*pubToken]struct{}),
		lastWrite: time.Now(),
	}
	if props.ServerKeepAlive != nil {
		// The broker's word overrides the client's ([MQTT-3.2.2-21]); 0
		// turns keepalive off.
		cn.keepAlive = time.Duration(*props.ServerKeepAlive) * time.Second
	}
	if props.ReceiveMaximum != nil {
		cn.receiveMax = int(*props.ReceiveMaximum)
	}
	if props.MaximumPacketSize != nil {
		cn.maxPacket = int(*props.MaximumPacketSize)
	}
	p.wg.Add(3)
	go func() { defer p.wg.Done(); cn.write() }()
	go func() { defer p.wg.Done(); cn.read() }()
	go func() { defer p.wg.Done(); cn.ping() }()
	return cn, nil
}

func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// writePacket encodes cp and writes it in one call, so that the link's
// count of bytes written marks where it ends.
func writePacket(w io.Writer, cp *packets.ControlPacket) error {
	var b bytes.Buffer
	if _, err := cp.WriteTo(&b); err != nil {
		return err
	}
	_, err := w.Write(b.Bytes())
	return err
}

// readPacket reads one packet. A CONNACK of two bytes is a 3.1.1 broker's
// answer to the MQTT 5 CONNECT (which packets would fail to decode): it
// becomes a connackError, return code 1 meaning no MQTT 5.
func readPacket(r io.Reader) (*packets.ControlPacket, error) {
	var first [1]byte
	if _, err := io.ReadFull(r, first[:]); err != nil {
		return nil, err
	}
	var length, shift int
	var lenBytes []byte
	for {
		var b [1]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, noEOF(err)
		}
		lenBytes = append(lenBytes, b[0])
		length |= int(b[0]&0x7f) << shift
		if b[0]&0x80 == 0 {
			break
		}
		if shift += 7; shift > 21 {
			return nil, errors.New("outbox: mqtt: malformed remaining length")
		}
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, noEOF(err)
	}
	if first[0]>>4 == packets.CONNACK && length == 2 {
		e := &connackError{code: body[1]}
		if e.code == 0 {
			return nil, errors.New("outbox: mqtt: the broker accepted the MQTT 5 CONNECT with a 3.1.1 CONNACK")
		}
		if e.code == 1 {
			return nil, fmt.Errorf("%w: %w", errUnsupportedVersion, e)
		}
		return nil, e
	}
	whole := append(append([]byte{first[0]}, lenBytes...), body...)
	return packets.ReadPacket(bytes.NewReader(whole))
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func isReset(err error) bool {
	return strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe")
}

// packetSize is the size of a QoS 1 PUBLISH with these properties (packed).
func packetSize(topic string, props, payload []byte) int {
	propLen := 1
	for l := len(props); l >= 128; l >>= 7 {
		propLen++
	}
	rem := 2 + len(topic) + 2 + propLen + len(props) + len(payload)
	n := 1 + 1
	for l := rem; l >= 128; l >>= 7 {
		n++
	}
	return n + rem
}

// wireProperties converts p to the packet's properties; nil for none.
func wireProperties(p *PublishProperties) *packets.Properties {
	if p.empty() {
		return nil
	}
	wp := &packets.Properties{ContentType: p.ContentType}
	for _, u := range p.User {
		wp.User = append(wp.User, packets.User{Key: u.Key, Value: u.Value})
	}
	if p.MessageExpiry > 0 {
		s := mqttSecondsUp(p.MessageExpiry)
		wp.MessageExpiry = &s
	}
	return wp
}

func (c *mqtt5Conn) publish(topic string, payload []byte, props *PublishProperties) Token {
	wp := wireProperties(props)
	if c.maxPacket > 0 {
		if n := packetSize(topic, wp.Pack(packets.PUBLISH), payload); n > c.maxPacket {
			return failedToken{&refusal{permanent: true,
				msg: fmt.Sprintf("packet too large: the message is %d bytes as an MQTT packet, over the broker's Maximum Packet Size of %d (not sent)", n, c.maxPacket)}}
		}
	}
	t := &pubToken{topic: topic, payload: payload, props: wp, done: make(chan struct{}), link: c.link}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return failedToken{ErrNotConnected}
	}
	c.queued[t] = struct{}{}
	c.mu.Unlock()
	select {
	case c.queue <- t:
	case <-c.stop:
		c.mu.Lock()
		delete(c.queued, t)
		c.mu.Unlock()
		t.complete(ErrNotConnected)
	}
	return t
}

// write sends publishes in hand-off order, each under a packet id of its
// own.
func (c *mqtt5Conn) write() {
	for {
		var t *pubToken
		select {
		case <-c.stop:
			return
		case t = <-c.queue:
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		id := c.allocate()
		delete(c.queued, t)
		c.pending[id] = t
		c.mu.Unlock()
		cp := packets.NewControlPacket(packets.PUBLISH)
		pb := cp.Content.(*packets.Publish)
		pb.QoS, pb.Topic, pb.Payload, pb.PacketID = 1, t.topic, t.payload, id
		pb.Properties = t.props
		t.payload, t.props = nil, nil
		c.wmu.Lock()
		c.link.armed.Store(true)
		err := writePacket(c.conn, cp)
		c.link.armed.Store(false)
		c.lastWrite = time.Now()
		c.wmu.Unlock()
		if err != nil {
			c.fail(fmt.Errorf("outbox: mqtt: write: %w", err))
			return
		}
		t.end.Store(c.link.written.Load())
	}
}

// allocate returns a packet id not in use; the window is far below 65,535.
func (c *mqtt5Conn) allocate() uint16 {
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

// read completes tokens as their PUBACKs come.
func (c *mqtt5Conn) read() {
	for {
		cp, err := readPacket(c.conn)
		if err != nil {
			c.fail(err)
			return
		}
		switch p := cp.Content.(type) {
		case *packets.Puback:
			c.mu.Lock()
			t := c.pending[p.PacketID]
			delete(c.pending, p.PacketID)
			c.mu.Unlock()
			if t == nil {
				continue // a PUBACK for nothing in flight: not ours to judge
			}
			var err error
			if p.ReasonCode >= 0x80 {
				reason := ""
				if p.Properties != nil {
					reason = p.Properties.ReasonString
				}
				err = pubackError(p.ReasonCode, reason)
			}
			t.complete(err)
		case *packets.Pingresp:
			select {
			case c.pingresp <- struct{}{}:
			default:
			}
		case *packets.Disconnect:
			e := &disconnectError{code: p.ReasonCode}
			if p.Properties != nil {
				e.reason = p.Properties.ReasonString
			}
			c.fail(e)
			return
		}
	}
}

// ping keeps the connection alive and notices a dead one: a PINGREQ after
// KeepAlive without writing; no PINGRESP within PingTimeout of its leaving
// ends the connection.
func (c *mqtt5Conn) ping() {
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
		err := writePacket(c.conn, packets.NewControlPacket(packets.PINGREQ))
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
			c.fail(errors.New("outbox: mqtt: no PINGRESP within the ping timeout"))
			return
		}
		t.Reset(c.keepAlive)
	}
}

// fail ends a connection that broke (or that the broker ended).
func (c *mqtt5Conn) fail(err error) {
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

// lostReason is why the connection ended, if the broker said.
func (c *mqtt5Conn) lostReason() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var de *disconnectError
	if errors.As(c.lostErr, &de) {
		return de
	}
	return nil
}

func (c *mqtt5Conn) close() { c.shut(true) }

// shut closes the connection once; tokens in flight fail at once. A close
// asked for sends a DISCONNECT first, in the background: nothing more may be
// acknowledged on this connection.
func (c *mqtt5Conn) shut(asked bool) {
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
	cause := error(errDisconnected)
	if c.lostErr != nil {
		cause = fmt.Errorf("%w: %w", errDisconnected, c.lostErr)
	}
	pending, queued := c.pending, c.queued
	c.pending, c.queued = nil, nil
	c.mu.Unlock()
	for _, t := range pending {
		t.complete(t.classify(cause))
	}
	for t := range queued {
		t.complete(ErrNotConnected)
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
			writePacket(c.conn, packets.NewControlPacket(packets.DISCONNECT))
			c.wmu.Unlock()
		}
		c.conn.Close()
	}()
}
