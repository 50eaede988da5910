package mqtt

import (
	"errors"
	"fmt"
	"strings"
)

// What the publish connection accepts from a broker once connected, read
// with the rules of the version it speaks: a PUBACK, a PINGRESP, on MQTT 5
// a DISCONNECT, and a PUBLISH it answers though it subscribed to nothing.
// Anything else, or any of these malformed, is the broker breaking the
// protocol: the connection ends with a ProtocolError, which is the
// connection's fault and never a message's.

// MaxInboundPacket is the largest packet, in bytes, the publish connection
// accepts from a broker, announced as the Maximum Packet Size of its MQTT 5
// CONNECT. What it receives is small (a CONNACK, PUBACKs, PINGRESPs, a
// DISCONNECT): 16 KiB holds any of them with a reason string and user
// properties of a few KiB. A compliant broker leaves out a reason string or
// user property that would go over it; on 3.1.1 no packet comes near it.
// Nothing larger is ever allocated for a packet, whatever its Remaining
// Length says.
const MaxInboundPacket = 16 << 10

// ProtocolError is a packet from the broker that breaks MQTT (malformed, or
// one the publisher never expects): the connection is closed for it. It is
// the connection's fault: the messages in flight fail with ErrDisconnected
// wrapping it.
type ProtocolError struct {
	Version string // "3.1.1" or "5"
	Problem string // what was wrong, in words
}

// Error says that the broker broke the protocol, and how.
func (e *ProtocolError) Error() string {
	return "MQTT " + e.Version + " protocol error by the broker: " + e.Problem + " (connection closed)"
}

func protocolError(v311 bool, format string, args ...any) *ProtocolError {
	v := "5"
	if v311 {
		v = "3.1.1"
	}
	return &ProtocolError{Version: v, Problem: fmt.Sprintf(format, args...)}
}

// inbound is what one packet from the broker asks of the connection.
type inbound struct {
	kind    byte   // PUBACK, PINGRESP, DISCONNECT or PUBLISH (packets' numbers)
	id      uint16 // a PUBACK's; a QoS 1 PUBLISH's, to acknowledge; else 0
	code    byte   // a PUBACK's or DISCONNECT's reason code (MQTT 5)
	reason  string // their Reason String (MQTT 5)
	ref     string // a DISCONNECT's Server Reference (MQTT 5)
	publish bool   // a PUBLISH: nothing to do but acknowledge id, if not 0
}

// Packet types, as the fixed header's high four bits carry them.
const (
	typeConnack    = 2
	typePublish    = 3
	typePuback     = 4
	typePingresp   = 13
	typeDisconnect = 14
)

var packetNames = [16]string{"reserved type 0", "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL", "PUBCOMP",
	"SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ", "PINGRESP", "DISCONNECT", "AUTH"}

// packetName names a packet by its first byte.
func packetName(first byte) string { return packetNames[first>>4] }

// decodeInbound reads a packet that readFrame read, by the rules of MQTT
// 3.1.1 (v311) or 5.
func decodeInbound(v311 bool, first byte, body []byte) (inbound, error) {
	kind := first >> 4
	bad := func(format string, args ...any) (inbound, error) {
		return inbound{}, protocolError(v311, format, args...)
	}
	switch kind {
	case typePuback:
		if first&0x0f != 0 {
			return bad("malformed PUBACK: reserved flags 0x%X", first&0x0f)
		}
		if len(body) < 2 {
			return bad("malformed PUBACK: %d bytes, without a packet id", len(body))
		}
		in := inbound{kind: kind, id: uint16(body[0])<<8 | uint16(body[1])}
		if in.id == 0 {
			return bad("malformed PUBACK: packet id 0")
		}
		if v311 {
			if len(body) != 2 {
				return bad("malformed PUBACK: %d bytes where MQTT 3.1.1 has 2 (no reason code)", len(body))
			}
			return in, nil
		}
		if len(body) == 2 {
			return in, nil
		}
		// A code below 0x80 is a success (some brokers send 0x01, the
		// QoS): only those of 0x80 or more refuse.
		in.code = body[2]
		props, err := readProperties(body[3:], true, pubackProperties)
		if err != nil {
			return bad("malformed PUBACK: %v", err)
		}
		in.reason = props.reason
		return in, nil
	case typePingresp:
		if first != typePingresp<<4 || len(body) != 0 {
			return bad("malformed PINGRESP: flags 0x%X, %d bytes", first&0x0f, len(body))
		}
		return inbound{kind: kind}, nil
	case typeDisconnect:
		if v311 {
			return bad("a DISCONNECT, which an MQTT 3.1.1 broker never sends")
		}
		if first&0x0f != 0 {
			return bad("malformed DISCONNECT: reserved flags 0x%X", first&0x0f)
		}
		in := inbound{kind: kind}
		if len(body) == 0 {
			return in, nil
		}
		in.code = body[0]
		props, err := readProperties(body[1:], true, disconnectProperties)
		if err != nil {
			return bad("malformed DISCONNECT: %v", err)
		}
		in.reason, in.ref = props.reason, props.ref
		return in, nil
	case typePublish:
		return decodePublish(v311, first, body)
	}
	return bad("an unexpected %s, which a publisher that subscribed to nothing never gets", packetName(first))
}

// decodePublish reads a PUBLISH the broker sent to the publisher, which
// subscribed to nothing (a broker's bug): at QoS 0 it is dropped, at QoS 1
// acknowledged and dropped; QoS 2, which the publisher does not take, is a
// protocol error.
func decodePublish(v311 bool, first byte, body []byte) (inbound, error) {
	bad := func(format string, args ...any) (inbound, error) {
		return inbound{}, protocolError(v311, format, args...)
	}
	qos := first >> 1 & 3
	switch {
	case qos == 3:
		return bad("malformed PUBLISH: QoS 3")
	case qos == 2:
		return bad("a QoS 2 PUBLISH to a publisher that subscribed to nothing")
	case qos == 0 && first&0x08 != 0:
		return bad("malformed PUBLISH: DUP set at QoS 0")
	}
	if len(body) < 2 {
		return bad("malformed PUBLISH: %d bytes, without a topic", len(body))
	}
	n := 2 + (int(body[0])<<8 | int(body[1]))
	rest := len(body) - n
	if qos > 0 {
		rest -= 2
	}
	if rest < 0 {
		return bad("malformed PUBLISH: its topic and packet id run past its end")
	}
	in := inbound{kind: typePublish, publish: true}
	if qos > 0 {
		in.id = uint16(body[n])<<8 | uint16(body[n+1])
		if in.id == 0 {
			return bad("malformed PUBLISH: packet id 0")
		}
		n += 2
	}
	if !v311 {
		plen, w, err := readVarint(body[n:])
		if err != nil || plen > len(body)-n-w {
			return bad("malformed PUBLISH: its properties run past its end")
		}
		if _, err := readProperties(body[n:n+w+plen], false, publishProperties); err != nil {
			return bad("malformed PUBLISH: %v", err)
		}
	}
	return in, nil
}

// inboundProperties are the MQTT 5 properties the publisher reads.
type inboundProperties struct {
	reason string // Reason String
	ref    string // Server Reference
}

// The properties each packet may carry (MQTT 5, 3.4.2.2, 3.14.2.2,
// 3.3.2.3): any other is a malformed packet.
const (
	pubackProperties     = "\x1F\x26"                         // Reason String, User Property
	disconnectProperties = "\x11\x1F\x26\x1C"                 // and Session Expiry Interval, Server Reference
	publishProperties    = "\x01\x02\x23\x08\x09\x0B\x26\x03" // Payload Format … Content Type
)

// readProperties reads an MQTT 5 property block (its length, then the
// properties), checking that each property is well formed, one the packet
// may carry (allowed), given once unless MQTT lets it repeat (a User
// Property, a Subscription Identifier), and that the block fills b exactly.
// With optional, an empty b is no properties.
func readProperties(b []byte, optional bool, allowed string) (inboundProperties, error) {
	var p inboundProperties
	var seen uint64 // a bit per property id (all are below 64)
	if len(b) == 0 && optional {
		return p, nil
	}
	n, w, err := readVarint(b)
	if err != nil {
		return p, err
	}
	if n != len(b)-w {
		return p, fmt.Errorf("a property length of %d where %d bytes remain", n, len(b)-w)
	}
	b = b[w:]
	for len(b) > 0 {
		id, w, err := readVarint(b)
		if err != nil {
			return p, err
		}
		b = b[w:]
		var size int
		switch id {
		case 0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A: // a byte
			size = 1
		case 0x13, 0x21, 0x22, 0x23: // two bytes
			size = 2
		case 0x02, 0x11, 0x18, 0x27: // four bytes
			size = 4
		case 0x0B: // a Variable Byte Integer
			_, size, err = readVarint(b)
		case 0x03, 0x08, 0x12, 0x15, 0x1A, 0x1C, 0x1F, 0x09, 0x16: // a string or binary data
			size, err = stringSize(b)
		case 0x26: // a user property: two strings
			var k, v int
			if k, err = stringSize(b); err == nil {
				v, err = stringSize(b[k:])
				size = k + v
			}
		default:
			return p, fmt.Errorf("unknown property 0x%02X", id)
		}
		if err != nil {
			return p, fmt.Errorf("property 0x%02X: %w", id, err)
		}
		if size > len(b) {
			return p, fmt.Errorf("property 0x%02X runs past the end", id)
		}
		if !strings.ContainsRune(allowed, rune(id)) {
			return p, fmt.Errorf("property 0x%02X, which this packet may not carry", id)
		}
		if seen&(1<<id) != 0 && id != 0x26 && id != 0x0B {
			return p, fmt.Errorf("property 0x%02X given twice", id)
		}
		seen |= 1 << id
		switch id {
		case 0x1F:
			p.reason = text(b[2:size])
		case 0x1C:
			p.ref = text(b[2:size])
		}
		b = b[size:]
	}
	return p, nil
}

var errTruncated = errors.New("truncated")

// stringSize is the size of the MQTT string or binary data at the start of
// b, its two length bytes included.
func stringSize(b []byte) (int, error) {
	if len(b) < 2 {
		return 0, errTruncated
	}
	n := 2 + (int(b[0])<<8 | int(b[1]))
	if n > len(b) {
		return 0, errTruncated
	}
	return n, nil
}

// readVarint reads an MQTT Variable Byte Integer: its value and its size.
func readVarint(b []byte) (n, size int, err error) {
	for i := 0; i < 4; i++ {
		if i >= len(b) {
			return 0, 0, errTruncated
		}
		n |= int(b[i]&0x7f) << (7 * i)
		if b[i]&0x80 == 0 {
			if i > 0 && b[i] == 0 {
				// 0x9F 0x00 is 31 in two bytes: [MQTT-1.5.5-1] wants
				// the fewest, and paho reads a property id in one.
				return 0, 0, errors.New("a variable byte integer not in the fewest bytes")
			}
			return n, i + 1, nil
		}
	}
	return 0, 0, errors.New("a variable byte integer of more than 4 bytes")
}

// text is a broker's string made fit for a log line and an error: valid
// UTF-8, at most 256 bytes.
func text(b []byte) string {
	s := strings.ToValidUTF8(string(b[:min(len(b), 256)]), "\uFFFD")
	if len(b) > 256 {
		s += "…"
	}
	return s
}
