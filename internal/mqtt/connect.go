package mqtt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/eclipse/paho.golang/packets"
	packets311 "github.com/eclipse/paho.mqtt.golang/packets"
)

// The CONNECT and its CONNACK, in both versions, for the publish
// connection; and what a failed MQTT 5 CONNECT says about the broker's
// versions, for Auto (Brokers.Connect), which the subscriber's MQTT 5
// session reports too.

var (
	// ErrUnsupportedVersion: the broker answered the MQTT 5 CONNECT with
	// "unsupported protocol version" (5.0 reason 0x84, or a 3.1.1 return
	// code 1).
	ErrUnsupportedVersion = errors.New("the broker does not speak MQTT 5")
	// ErrClosedAfterConnect: the broker closed the connection after the
	// MQTT 5 CONNECT without a CONNACK: some 3.1.1 brokers do, and so does
	// an outage.
	ErrClosedAfterConnect = errors.New("the broker closed the connection without a CONNACK")
)

// Open opens a publish connection for the attempt a, with a clean session,
// and calls a.Connected once the broker accepted it. Its error says in
// words what went wrong and wraps the cause.
func Open(ctx context.Context, a *Attempt, o *Options) (*Conn, error) {
	open, version := open311, "mqtt"
	if a.V5 {
		open, version = open5, "mqtt 5"
	}
	c, err := open(ctx, a.URL, o)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("outbox: %s connect to %s: %s: %w", version, Redact(a.URL), explain(err, time.Now()), err)
	}
	a.Connected()
	if a.V5 {
		o.Logger.Debug("outbox mqtt: connected", "broker", Redact(a.URL), "protocol", "5",
			"receive_maximum", c.receiveMax, "maximum_packet_size", c.maxPacket)
	} else {
		o.Logger.Debug("outbox mqtt: connected", "broker", Redact(a.URL), "protocol", "3.1.1")
	}
	return c, nil
}

// dialForConnect dials the broker for a CONNECT of either version: until
// stopWatch is called (at the CONNACK), a cancelled ctx closes the
// connection at once, and ConnectTimeout bounds the handshake.
func dialForConnect(ctx context.Context, u *url.URL, o *Options) (conn net.Conn, l *link, stopWatch func() bool, err error) {
	tlsCfg, err := tlsConfigFor(o.TLSConfig, o.TLSFiles)
	if err != nil {
		return nil, nil, nil, err
	}
	d := dialer{tls: tlsCfg, timeout: o.ConnectTimeout, control: o.Control,
		under: func(raw net.Conn) net.Conn { l = newLink(raw, o.WriteTimeout); return l }}
	conn, err = d.dial(ctx, u)
	if err != nil {
		return nil, nil, nil, err
	}
	stopWatch = context.AfterFunc(ctx, func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(o.ConnectTimeout))
	return conn, l, stopWatch, nil
}

// open311 opens an MQTT 3.1.1 connection with a clean session; the CONNECT
// and its CONNACK go through paho.mqtt.golang's packets package, whose
// errors for a refusal explain knows.
func open311(ctx context.Context, u *url.URL, o *Options) (*Conn, error) {
	conn, l, stopWatch, err := dialForConnect(ctx, u, o)
	if err != nil {
		return nil, err
	}
	defer stopWatch()
	cp := packets311.NewControlPacket(packets311.Connect).(*packets311.ConnectPacket)
	cp.ProtocolName, cp.ProtocolVersion, cp.CleanSession = "MQTT", 4, true
	cp.ClientIdentifier = o.ClientID
	cp.Keepalive = uint16(min(o.KeepAlive/time.Second, 65535))
	if o.Username != "" {
		cp.UsernameFlag, cp.Username = true, o.Username
		cp.PasswordFlag, cp.Password = true, []byte(o.Password)
	}
	var b bytes.Buffer
	if err := cp.Write(&b); err != nil {
		conn.Close()
		return nil, err
	}
	if _, err := conn.Write(b.Bytes()); err != nil {
		conn.Close()
		return nil, ctxOr(ctx, err)
	}
	code, err := readConnack311(conn)
	if err != nil {
		conn.Close()
		return nil, ctxOr(ctx, err)
	}
	if code != packets311.Accepted {
		conn.Close()
		return nil, &ConnackError{Code: code}
	}
	conn.SetDeadline(time.Time{})
	c := newConn(conn, l, true, o)
	c.start()
	return c, nil
}

// readConnack311 reads the answer to a 3.1.1 CONNECT, which must be a
// CONNACK, and returns its return code. A session present after a clean
// session was asked for is a ProtocolError ([MQTT-3.2.2-1]).
func readConnack311(r io.Reader) (code byte, err error) {
	first, body, err := readFrame(r, nil, true)
	if err != nil {
		return 0, err
	}
	switch {
	case first>>4 != typeConnack:
		return 0, protocolError(true, "the broker answered the CONNECT with a %s", packetName(first))
	case first != typeConnack<<4 || len(body) != 2 || body[0]&0xFE != 0:
		return 0, protocolError(true, "malformed CONNACK (% X)", body[:min(len(body), 8)])
	case body[0] == 1 && body[1] == packets311.Accepted:
		return 0, protocolError(true, "CONNACK with Session Present after a clean session was asked for")
	}
	return body[1], nil
}

// open5 opens an MQTT 5 connection with a clean start and no session kept
// by the broker.
func open5(ctx context.Context, u *url.URL, o *Options) (*Conn, error) {
	conn, l, stopWatch, err := dialForConnect(ctx, u, o)
	if err != nil {
		return nil, err
	}
	defer stopWatch()
	cp := packets.NewControlPacket(packets.CONNECT)
	cc := cp.Content.(*packets.Connect)
	cc.ProtocolName, cc.ProtocolVersion, cc.CleanStart = "MQTT", 5, true
	cc.ClientID = o.ClientID
	cc.KeepAlive = uint16(min(o.KeepAlive/time.Second, 65535))
	maxPacket := uint32(MaxInboundPacket)
	cc.Properties = &packets.Properties{MaximumPacketSize: &maxPacket}
	if o.Username != "" {
		cc.UsernameFlag, cc.Username = true, o.Username
		cc.PasswordFlag, cc.Password = true, []byte(o.Password)
	}
	if err := writePacket(conn, cp); err != nil {
		conn.Close()
		return nil, ctxOr(ctx, err)
	}
	ack, err := readConnack5(conn)
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ce *ConnackError
		switch {
		case errors.As(err, &ce):
			return nil, err
		case closedEarly(err):
			return nil, fmt.Errorf("%w: %w", ErrClosedAfterConnect, err)
		}
		return nil, err
	}
	ca, ok := ack.Content.(*packets.Connack)
	if !ok {
		conn.Close()
		return nil, protocolError(false, "the broker answered the CONNECT with a %s", packetName(ack.FixedHeader.Type<<4))
	}
	props := ca.Properties
	if props == nil {
		props = &packets.Properties{}
	}
	if ca.ReasonCode >= 0x80 {
		conn.Close()
		e := &ConnackError{Code: ca.ReasonCode, V5: true, Reason: props.ReasonString}
		if ca.ReasonCode == packets.ConnackUnsupportedProtocolVersion {
			return nil, fmt.Errorf("%w: %w", ErrUnsupportedVersion, e)
		}
		return nil, e
	}
	if props.MaximumQOS != nil && *props.MaximumQOS < 1 {
		conn.Close()
		return nil, fmt.Errorf("outbox: mqtt: the broker allows QoS 0 only, and the outbox publishes at QoS 1")
	}
	if err := checkConnack5(ca, props); err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	c := newConn(conn, l, false, o)
	if props.ServerKeepAlive != nil {
		// The broker's word overrides the client's ([MQTT-3.2.2-21]); 0
		// turns keepalive off.
		c.keepAlive = time.Duration(*props.ServerKeepAlive) * time.Second
	}
	if props.ReceiveMaximum != nil {
		c.receiveMax = int(*props.ReceiveMaximum)
	}
	if props.MaximumPacketSize != nil {
		c.maxPacket = int(*props.MaximumPacketSize)
	}
	c.start()
	return c, nil
}

// checkConnack5 holds an accepting MQTT 5 CONNACK to the rules a client
// must enforce: no session after a Clean Start ([MQTT-3.2.2-2]), and no
// Receive Maximum or Maximum Packet Size of 0 (a protocol error, 3.2.2.3).
func checkConnack5(ca *packets.Connack, props *packets.Properties) error {
	switch {
	case ca.SessionPresent:
		return protocolError(false, "CONNACK with Session Present after a Clean Start")
	case props.ReceiveMaximum != nil && *props.ReceiveMaximum == 0:
		return protocolError(false, "CONNACK with a Receive Maximum of 0")
	case props.MaximumPacketSize != nil && *props.MaximumPacketSize == 0:
		return protocolError(false, "CONNACK with a Maximum Packet Size of 0")
	}
	return nil
}

// readConnack5 reads the answer to an MQTT 5 CONNECT. A CONNACK of two
// bytes is a 3.1.1 broker's (which packets would fail to decode): it
// becomes a ConnackError, return code 1 meaning no MQTT 5.
func readConnack5(r io.Reader) (*packets.ControlPacket, error) {
	first, body, err := readFrame(r, nil, false)
	if err != nil {
		return nil, err
	}
	if first>>4 == packets.CONNACK && len(body) == 2 {
		e := &ConnackError{Code: body[1]}
		if e.Code == 0 {
			return nil, errors.New("outbox: mqtt: the broker accepted the MQTT 5 CONNECT with a 3.1.1 CONNACK")
		}
		if e.Code == 1 {
			return nil, fmt.Errorf("%w: %w", ErrUnsupportedVersion, e)
		}
		return nil, e
	}
	cp, err := decodeFrame(first, body)
	if err != nil {
		return nil, protocolError(false, "malformed %s: %v", packetName(first), err)
	}
	return cp, nil
}

// closedEarly reports whether err is the broker closing the connection
// (a close or a reset), as opposed to a timeout or a malformed answer.
func closedEarly(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe")
}

func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
