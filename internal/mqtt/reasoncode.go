package mqtt

import (
	"fmt"
	"strings"
)

// What an MQTT broker's reason codes say: a CONNACK that refuses the
// connection, a PUBACK that refuses one message, a DISCONNECT, each in
// words a user can act on. Whose fault each is, the caller decides.

// ConnackError is a CONNACK that refused the connection.
type ConnackError struct {
	Code   byte
	V5     bool   // an MQTT 5 reason code; else a 3.1.1 return code
	Reason string // the broker's Reason String (MQTT 5); may be empty
}

// Error is "CONNACK " and the code in words.
func (e *ConnackError) Error() string {
	s := "CONNACK " + connackWords(e.Code, e.V5)
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

func connackWords(code byte, v5 bool) string {
	if !v5 {
		words := map[byte]string{1: "unacceptable protocol version", 2: "client id rejected", 3: "server unavailable",
			4: "bad user name or password", 5: "not authorised"}
		if w, ok := words[code]; ok {
			return fmt.Sprintf("%s (%d)", w, code)
		}
		return fmt.Sprintf("return code %d", code)
	}
	return reasonWords(code) + fmt.Sprintf(" (0x%02X)", code)
}

// reasonWords names an MQTT 5 reason code.
func reasonWords(code byte) string {
	switch code {
	case 0x00:
		return "success"
	case 0x10:
		return "no matching subscribers"
	case 0x80:
		return "unspecified error"
	case 0x81:
		return "malformed packet"
	case 0x82:
		return "protocol error"
	case 0x83:
		return "implementation specific error"
	case 0x84:
		return "unsupported protocol version"
	case 0x85:
		return "client identifier not valid"
	case 0x86:
		return "bad user name or password"
	case 0x87:
		return "not authorized"
	case 0x88:
		return "server unavailable"
	case 0x89:
		return "server busy"
	case 0x8A:
		return "banned"
	case 0x8B:
		return "server shutting down"
	case 0x8C:
		return "bad authentication method"
	case 0x8D:
		return "keep alive timeout"
	case 0x8E:
		return "session taken over"
	case 0x90:
		return "topic name invalid"
	case 0x91:
		return "packet identifier in use"
	case 0x93:
		return "receive maximum exceeded"
	case 0x94:
		return "topic alias invalid"
	case 0x95:
		return "packet too large"
	case 0x96:
		return "message rate too high"
	case 0x97:
		return "quota exceeded"
	case 0x98:
		return "administrative action"
	case 0x99:
		return "payload format invalid"
	case 0x9A:
		return "retain not supported"
	case 0x9B:
		return "QoS not supported"
	case 0x9C:
		return "use another server"
	case 0x9D:
		return "server moved"
	case 0x9F:
		return "connection rate exceeded"
	case 0xA0:
		return "maximum connect time"
	}
	return "reason code"
}

// PubackError is a PUBACK reason code of 0x80 or more: the broker refused
// the message. Its text is the code in words, with the broker's reason
// string if it adds to them: "not authorized (0x87)".
type PubackError struct {
	Code   byte   // the reason code, 0x80 or more
	Reason string // the broker's Reason String; may be empty
}

// Error is the code in words, then the reason string if it adds to them.
func (e *PubackError) Error() string {
	msg := fmt.Sprintf("%s (0x%02X)", reasonWords(e.Code), e.Code)
	if e.Reason != "" && !strings.EqualFold(e.Reason, reasonWords(e.Code)) {
		msg += ": " + e.Reason
	}
	return msg
}

// DisconnectError is a DISCONNECT the broker sent before closing (MQTT 5).
// A connection it ended fails its tokens with it, wrapped.
type DisconnectError struct {
	Code   byte   // the reason code
	Reason string // the broker's Reason String; may be empty
}

// Error is "the broker disconnected: " and the code in words.
func (e *DisconnectError) Error() string {
	s := fmt.Sprintf("the broker disconnected: %s (0x%02X)", reasonWords(e.Code), e.Code)
	if e.Reason != "" && !strings.EqualFold(e.Reason, reasonWords(e.Code)) {
		s += ": " + e.Reason
	}
	return s
}
