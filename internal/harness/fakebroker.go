package harness

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// FakeBroker is an MQTT broker that misbehaves on purpose, for the tests of
// the publisher's own defences: it accepts a CONNECT of either version on a
// loopback port, answers with a scripted CONNACK, and answers each PUBLISH
// as its script says (raw bytes, a delay, bytes trickled one at a time, a
// close, a stop to reading); by default it behaves, acknowledging each
// PUBLISH at once and answering PINGREQs. It routes nothing: it records the
// PUBLISHes it received, in order.
type FakeBroker struct {
	opts FakeBrokerOptions
	ln   net.Listener
	wg   sync.WaitGroup
	done chan struct{} // closed by Close

	mu       sync.Mutex
	conns    []net.Conn
	connects []FakeConnect
	received []FakePublish
	acks     []uint16
	closed   bool
}

// FakeBrokerOptions script a FakeBroker. Connections are numbered from 1 in
// the order they connect; a nil function, or a zero answer, behaves.
type FakeBrokerOptions struct {
	// Connack is the raw CONNACK for connection n, whose CONNECT spoke
	// level (4: 3.1.1, 5); nil: an accepting CONNACK of that version.
	Connack func(n int, level byte) []byte
	// AfterConnack, if set, is written on connection n right after the
	// CONNACK: a packet the publisher does not expect.
	AfterConnack func(n int, level byte) []byte
	// AfterSubscribe, if set, is written on connection n when a SUBSCRIBE
	// arrives (no SUBACK is sent): what a subscriber gets once it asked.
	AfterSubscribe func(n int, level byte) []byte
	// Answer is what connection n does with its publish p.
	Answer func(n int, p FakePublish) FakeAnswer
	// NoPingresp, if set, leaves the PINGREQs of connection n unanswered
	// when it returns true.
	NoPingresp func(n int) bool
}

// FakeAnswer is how a FakeBroker answers one PUBLISH. Its parts apply in
// this order: Delay, Raw (or the PUBACK), Close, StopReading.
type FakeAnswer struct {
	// Delay holds the answer, and the reading of what follows, this long.
	Delay time.Duration
	// Raw is written instead of a PUBACK of success; Silent writes
	// nothing.
	Raw    []byte
	Silent bool
	// Trickle writes the answer a byte at a time, this long apart.
	Trickle time.Duration
	// Close closes the connection after the answer.
	Close bool
	// StopReading stops reading the connection (it stays open), so that
	// the publisher's writes back up.
	StopReading bool
}

// FakeConnect is a CONNECT a FakeBroker received.
type FakeConnect struct {
	Level     byte   // 4: 3.1.1, 5
	ClientID  string // the client id
	MaxPacket uint32 // the Maximum Packet Size announced (MQTT 5); 0: none
}

// FakePublish is a PUBLISH a FakeBroker received.
type FakePublish struct {
	Conn    int // the connection's number, from 1
	Index   int // the publish's number on its connection, from 1
	Level   byte
	ID      uint16 // the packet id
	Topic   string
	Payload []byte
}

// StartFakeBroker starts a FakeBroker on a free loopback port, closed when
// the test ends.
func StartFakeBroker(tb TB, opts FakeBrokerOptions) *FakeBroker {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(tb, err, "fake broker: listen")
	b := &FakeBroker{opts: opts, ln: ln, done: make(chan struct{})}
	b.wg.Add(1)
	go b.accept()
	tb.Cleanup(b.Close)
	return b
}

// Addr is the broker's host:port.
func (b *FakeBroker) Addr() string { return b.ln.Addr().String() }

// URL is the broker's tcp:// URL.
func (b *FakeBroker) URL() string { return "tcp://" + b.Addr() }

// Connects are the CONNECTs received, in order.
func (b *FakeBroker) Connects() []FakeConnect {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]FakeConnect(nil), b.connects...)
}

// Received are the PUBLISHes received, in order, on every connection.
func (b *FakeBroker) Received() []FakePublish {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]FakePublish(nil), b.received...)
}

// Acks are the packet ids of the PUBACKs received (the publisher's answers
// to PUBLISHes the script sent it), in order.
func (b *FakeBroker) Acks() []uint16 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]uint16(nil), b.acks...)
}

// Close stops the broker, closes its connections and waits for its
// goroutines.
func (b *FakeBroker) Close() {
	b.mu.Lock()
	if !b.closed {
		close(b.done)
	}
	b.closed = true
	conns := b.conns
	b.conns = nil
	b.mu.Unlock()
	b.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	b.wg.Wait()
}

func (b *FakeBroker) accept() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			c.Close()
			return
		}
		b.conns = append(b.conns, c)
		n := len(b.connects) + 1
		b.connects = append(b.connects, FakeConnect{})
		b.mu.Unlock()
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer c.Close()
			b.serve(n, c)
		}()
	}
}

// serve runs connection n: its CONNECT, then its packets, until it closes
// or its script stops it.
func (b *FakeBroker) serve(n int, c net.Conn) {
	r := bufio.NewReader(c)
	first, body, err := readPacket(r)
	if err != nil || first>>4 != packets.Connect {
		return
	}
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}}
	if err := pk.ConnectDecode(body); err != nil {
		return
	}
	level := pk.ProtocolVersion
	b.mu.Lock()
	b.connects[n-1] = FakeConnect{Level: level, ClientID: pk.Connect.ClientIdentifier, MaxPacket: pk.Properties.MaximumPacketSize}
	b.mu.Unlock()
	connack := []byte{0x20, 2, 0, 0}
	if level == 5 {
		connack = []byte{0x20, 3, 0, 0, 0}
	}
	if b.opts.Connack != nil {
		if raw := b.opts.Connack(n, level); raw != nil {
			connack = raw
		}
	}
	if b.opts.AfterConnack != nil {
		connack = append(connack, b.opts.AfterConnack(n, level)...)
	}
	if _, err := c.Write(connack); err != nil {
		return
	}
	index := 0
	for {
		first, body, err := readPacket(r)
		if err != nil {
			return
		}
		switch first >> 4 {
		case packets.Pingreq:
			if b.opts.NoPingresp == nil || !b.opts.NoPingresp(n) {
				if _, err := c.Write([]byte{0xD0, 0}); err != nil {
					return
				}
			}
		case packets.Disconnect:
			return
		case packets.Subscribe:
			if b.opts.AfterSubscribe != nil {
				if _, err := c.Write(b.opts.AfterSubscribe(n, level)); err != nil {
					return
				}
			}
		case packets.Puback:
			if len(body) >= 2 {
				b.mu.Lock()
				b.acks = append(b.acks, uint16(body[0])<<8|uint16(body[1]))
				b.mu.Unlock()
			}
		case packets.Publish:
			pub := packets.Packet{ProtocolVersion: level}
			if err := pub.FixedHeader.Decode(first); err != nil {
				return
			}
			pub.FixedHeader.Remaining = len(body)
			if err := pub.PublishDecode(body); err != nil {
				return
			}
			index++
			p := FakePublish{Conn: n, Index: index, Level: level, ID: pub.PacketID, Topic: pub.TopicName,
				Payload: append([]byte(nil), pub.Payload...)}
			b.mu.Lock()
			b.received = append(b.received, p)
			b.mu.Unlock()
			var a FakeAnswer
			if b.opts.Answer != nil {
				a = b.opts.Answer(n, p)
			}
			if !b.answer(c, p, a) {
				return
			}
			if a.StopReading {
				<-b.done
				return
			}
		}
	}
}

// answer answers one PUBLISH; false: the connection is over.
func (b *FakeBroker) answer(c net.Conn, p FakePublish, a FakeAnswer) bool {
	if a.Delay > 0 && !b.sleep(a.Delay) {
		return false
	}
	out := a.Raw
	if out == nil && !a.Silent {
		out = []byte{0x40, 2, byte(p.ID >> 8), byte(p.ID)}
	}
	if a.Trickle > 0 {
		for i := range out {
			if _, err := c.Write(out[i : i+1]); err != nil || !b.sleep(a.Trickle) {
				return false
			}
		}
	} else if len(out) > 0 {
		if _, err := c.Write(out); err != nil {
			return false
		}
	}
	return !a.Close
}

// sleep waits d, or less if the broker closes; false if it did.
func (b *FakeBroker) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-b.done:
		return false
	}
}

// readPacket reads one MQTT packet: its first byte and its body.
func readPacket(r *bufio.Reader) (first byte, body []byte, err error) {
	if first, err = r.ReadByte(); err != nil {
		return 0, nil, err
	}
	n, _, err := packets.DecodeLength(r)
	if err != nil {
		return 0, nil, err
	}
	if n > 1<<24 {
		return 0, nil, errors.New("fake broker: a packet over 16 MiB")
	}
	body = make([]byte, n)
	_, err = io.ReadFull(r, body)
	return first, body, err
}
