package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
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

// connect5 opens an MQTT 5 connection with a clean start and no session
// kept by the broker.
func (p *MQTTPublisher) connect5(ctx context.Context) (*mqttConn, error) {
	conn, link, stopWatch, err := p.dialForConnect(ctx)
	if err != nil {
		return nil, err
	}
	defer stopWatch()
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
	cn := p.newConn(conn, link, false)
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
	cn.start()
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
	first, body, err := readFrame(r, nil)
	if err != nil {
		return nil, err
	}
	if first>>4 == packets.CONNACK && len(body) == 2 {
		e := &connackError{code: body[1]}
		if e.code == 0 {
			return nil, errors.New("outbox: mqtt: the broker accepted the MQTT 5 CONNECT with a 3.1.1 CONNACK")
		}
		if e.code == 1 {
			return nil, fmt.Errorf("%w: %w", errUnsupportedVersion, e)
		}
		return nil, e
	}
	return decodeFrame(first, body)
}

// readFrame reads one packet's first byte and its body (what follows the
// Remaining Length), into buf if it is large enough.
func readFrame(r io.Reader, buf []byte) (first byte, body []byte, err error) {
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, nil, err
	}
	first = b[0]
	length, shift := 0, 0
	for {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, noEOF(err)
		}
		length |= int(b[0]&0x7f) << shift
		if b[0]&0x80 == 0 {
			break
		}
		if shift += 7; shift > 21 {
			return 0, nil, errors.New("outbox: mqtt: malformed remaining length")
		}
	}
	if cap(buf) >= length {
		body = buf[:length]
	} else {
		body = make([]byte, length)
	}
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, noEOF(err)
	}
	return first, body, nil
}

// decodeFrame decodes a packet that readFrame read, with paho.golang's
// packets.
func decodeFrame(first byte, body []byte) (*packets.ControlPacket, error) {
	whole := appendVarint([]byte{first}, len(body))
	return packets.ReadPacket(bytes.NewReader(append(whole, body...)))
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
