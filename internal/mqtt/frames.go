package mqtt

import (
	"bytes"
	"errors"
	"io"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// The packets the publish connection encodes and decodes itself, and the
// framing every packet shares. The PUBLISH is encoded here, into a buffer
// the writer reuses, because paho.golang's packets allocates for each one;
// a PUBACK without properties (every success) is decoded here for the same
// reason. Everything else goes through packets.

// Properties are what a PUBLISH may carry beside its payload, on MQTT 5.
type Properties struct {
	// ContentType is the payload's media type (Content Type).
	ContentType string
	// User holds the user properties, in order; a key may repeat.
	User []UserProperty
	// MessageExpiry is the message's remaining life (Message Expiry
	// Interval, sent in whole seconds rounded up); 0 means none.
	MessageExpiry time.Duration
	// CorrelationData is the requester's Correlation Data, sent back with
	// an answer; empty means none. The caller bounds it at 65,535 bytes.
	CorrelationData []byte
}

// UserProperty is one MQTT 5 user property.
type UserProperty struct {
	Key, Value string
}

// MaxRemainingLength is the largest Remaining Length an MQTT packet can
// have: 268,435,455 bytes.
const MaxRemainingLength = 268_435_455

// RemainingLength is the Remaining Length of the QoS 1 PUBLISH of a payload
// of n bytes to topic, which MQTT bounds at MaxRemainingLength: the topic
// and its length, the packet id, and on MQTT 5 (v5) the properties and
// their length.
func RemainingLength(topic string, n int, p *Properties, v5 bool) int {
	rem := 2 + len(topic) + 2 + n
	if v5 {
		props := propertiesSize(p)
		rem += varintSize(props) + props
	}
	return rem
}

// appendPublish311 appends an MQTT 3.1.1 PUBLISH at QoS 1: the fixed header,
// the Remaining Length, the topic, the packet id and the payload.
func appendPublish311(b []byte, topic string, id uint16, payload []byte) []byte {
	b = append(b, 0x32)
	b = appendVarint(b, 2+len(topic)+2+len(payload))
	b = appendString(b, topic)
	b = append(b, byte(id>>8), byte(id))
	return append(b, payload...)
}

// appendPublish5 appends an MQTT 5 PUBLISH at QoS 1 with the properties p
// carries, in the order paho.golang's packets writes them: Message Expiry
// Interval, Content Type, Correlation Data, the user properties.
func appendPublish5(b []byte, topic string, id uint16, payload []byte, p *Properties) []byte {
	props := 0
	if p != nil {
		props = propertiesSize(p)
	}
	b = append(b, 0x32)
	b = appendVarint(b, 2+len(topic)+2+varintSize(props)+props+len(payload))
	b = appendString(b, topic)
	b = append(b, byte(id>>8), byte(id))
	b = appendVarint(b, props)
	if props > 0 {
		if p.MessageExpiry > 0 {
			s := secondsUp(p.MessageExpiry)
			b = append(b, 0x02, byte(s>>24), byte(s>>16), byte(s>>8), byte(s))
		}
		if p.ContentType != "" {
			b = appendString(append(b, 0x03), p.ContentType)
		}
		if len(p.CorrelationData) > 0 {
			b = appendBinary(append(b, 0x09), p.CorrelationData)
		}
		for _, u := range p.User {
			b = appendString(appendString(append(b, 0x26), u.Key), u.Value)
		}
	}
	return append(b, payload...)
}

// The packets of a fixed few bytes, as paho's packages write them.
var (
	pingreq       = []byte{0xC0, 0x00} // both versions
	disconnect311 = []byte{0xE0, 0x00}
	disconnect5   = []byte{0xE0, 0x02, 0x00, 0x00} // normal disconnection, no properties
)

// appendVarint appends n as an MQTT Variable Byte Integer.
func appendVarint(b []byte, n int) []byte {
	for ; n >= 0x80; n >>= 7 {
		b = append(b, byte(n&0x7f)|0x80)
	}
	return append(b, byte(n))
}

// appendString appends s as an MQTT UTF-8 string: its length in two bytes,
// then its bytes.
func appendString(b []byte, s string) []byte {
	return append(append(b, byte(len(s)>>8), byte(len(s))), s...)
}

// appendBinary appends d as MQTT Binary Data: its length in two bytes,
// then its bytes.
func appendBinary(b []byte, d []byte) []byte {
	return append(append(b, byte(len(d)>>8), byte(len(d))), d...)
}

// secondsUp is d in whole seconds, rounded up, for an MQTT 5 interval.
func secondsUp(d time.Duration) uint32 {
	s := (d + time.Second - 1) / time.Second
	if s > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(s)
}

// propertiesSize is how many bytes p takes in a PUBLISH's properties.
func propertiesSize(p *Properties) int {
	if p == nil {
		return 0
	}
	n := 0
	if p.ContentType != "" {
		n += 1 + 2 + len(p.ContentType)
	}
	for _, u := range p.User {
		n += 1 + 2 + len(u.Key) + 2 + len(u.Value)
	}
	if p.MessageExpiry > 0 {
		n += 1 + 4
	}
	if len(p.CorrelationData) > 0 {
		n += 1 + 2 + len(p.CorrelationData)
	}
	return n
}

// varintSize is the size of n as an MQTT Variable Byte Integer.
func varintSize(n int) int {
	s := 1
	for ; n >= 128; n >>= 7 {
		s++
	}
	return s
}

// readFrame reads one packet from a broker speaking 3.1.1 (v311) or 5: its
// first byte and its body (what follows the Remaining Length), into buf if
// it is large enough. A packet over MaxInboundPacket is a ProtocolError,
// found before anything is allocated for it.
func readFrame(r io.Reader, buf []byte, v311 bool) (first byte, body []byte, err error) {
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, nil, err
	}
	first = b[0]
	length, shift, size := 0, 0, 1
	for {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, noEOF(err)
		}
		size++
		length |= int(b[0]&0x7f) << shift
		if b[0]&0x80 == 0 {
			if size > 2 && b[0] == 0 {
				return 0, nil, protocolError(v311, "malformed Remaining Length (not in the fewest bytes)")
			}
			break
		}
		if shift += 7; shift > 21 {
			return 0, nil, protocolError(v311, "malformed Remaining Length (more than 4 bytes)")
		}
	}
	if size+length > MaxInboundPacket {
		return 0, nil, protocolError(v311, "a %s of %d bytes, over the %d bytes this client accepts", packetName(first), size+length, MaxInboundPacket)
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

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
