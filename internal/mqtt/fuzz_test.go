package mqtt

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/eclipse/paho.golang/packets"
)

// FuzzPublish5 holds the MQTT 5 PUBLISH the connection writes to what
// paho.golang's packets writes for the same message, and the PUBACK the
// reader decodes itself to what packets decodes.
func FuzzPublish5(f *testing.F) {
	f.Add("pos/1/orders", []byte(`{"n":1}`), "application/json", "specversion", "1.0", uint32(0), uint16(1), []byte{0, 1, 0})
	f.Add("a", []byte{}, "", "", "", uint32(90), uint16(65535), []byte{0xff, 0xff, 0x87})
	f.Fuzz(func(t *testing.T, topic string, payload []byte, contentType, key, value string, expiry uint32, id uint16, ack []byte) {
		if len(topic) > 65535 || len(contentType) > 65535 || len(key) > 65535 || len(value) > 65535 {
			return
		}
		p := Properties{ContentType: contentType, MessageExpiry: time.Duration(expiry) * time.Second}
		if key != "" || value != "" {
			p.User = []UserProperty{{key, value}, {value, key}}
		}
		got := appendPublish5(nil, topic, id, payload, &p)
		cp := packets.NewControlPacket(packets.PUBLISH)
		pb := cp.Content.(*packets.Publish)
		pb.QoS, pb.Topic, pb.Payload, pb.PacketID = 1, topic, payload, id
		pb.Properties = pahoProperties(&p)
		var want bytes.Buffer
		if _, err := cp.WriteTo(&want); err != nil {
			t.Skip()
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("appendPublish5 wrote %x, packets %x", got, want.Bytes())
		}
		if rem := RemainingLength(topic, len(payload), &p, true); len(got) != 1+varintSize(rem)+rem {
			t.Fatalf("RemainingLength says %d, the packet is %d bytes", rem, len(got))
		}

		// A PUBACK the reader decodes itself, as packets decodes it.
		in, err := decodeInbound(false, packets.PUBACK<<4, ack)
		if err != nil {
			return
		}
		back, err := decodeFrame(packets.PUBACK<<4, ack)
		if err != nil {
			t.Fatalf("the reader took PUBACK body %x, packets refused it: %v", ack, err)
		}
		pa := back.Content.(*packets.Puback)
		reason := ""
		if pa.Properties != nil {
			reason = pa.Properties.ReasonString
		}
		if pa.PacketID != in.id || pa.ReasonCode != in.code || (utf8.ValidString(reason) && len(reason) <= 256 && reason != in.reason) {
			t.Fatalf("PUBACK %x: id %d code %d reason %q, packets says id %d code %d reason %q", ack, in.id, in.code, in.reason, pa.PacketID, pa.ReasonCode, reason)
		}
	})
}

// FuzzInbound feeds a stream of bytes from a broker, after the CONNACK, to
// the frame reader and the packet dispatch of either version (v5): it never
// panics, never allocates for a packet more than MaxInboundPacket, and
// whatever it refuses is a ProtocolError or a short read, never a message's
// fault.
func FuzzInbound(f *testing.F) {
	f.Add(false, []byte{0x40, 2, 0, 1, 0xD0, 0})
	f.Add(false, []byte{0x40, 3, 0, 1, 0x87})
	f.Add(true, []byte{0x40, 3, 0, 1, 0x87, 0x40, 9, 0, 1, 0x80, 5, 0x1F, 0, 2, 'n', 'o'})
	f.Add(true, []byte{0xE0, 1, 0x89})
	f.Add(true, []byte{0x32, 6, 0, 1, 'x', 0, 7, 0})
	f.Add(false, []byte{0x32, 5, 0, 1, 'x', 0, 7})
	f.Add(false, []byte{0x90, 3, 0, 1, 0})
	f.Add(true, []byte{0x30, 0xFF, 0xFF, 0xFF, 0x7F})
	f.Fuzz(func(t *testing.T, v5 bool, stream []byte) {
		r := bytes.NewReader(stream)
		var buf []byte
		for {
			first, body, err := readFrame(r, buf, !v5)
			if err != nil {
				var pe *ProtocolError
				if !errors.As(err, &pe) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("readFrame: %v", err)
				}
				return
			}
			if cap(body) > MaxInboundPacket {
				t.Fatalf("a buffer of %d bytes", cap(body))
			}
			if cap(body) > cap(buf) {
				buf = body[:0]
			}
			in, err := decodeInbound(!v5, first, body)
			if err != nil {
				var pe *ProtocolError
				if !errors.As(err, &pe) {
					t.Fatalf("decodeInbound: %v is no ProtocolError", err)
				}
				return
			}
			switch in.kind {
			case typePuback:
				if in.id == 0 || (!v5 && in.code != 0) {
					t.Fatalf("PUBACK % X read as id %d code %d", body, in.id, in.code)
				}
			case typePingresp, typePublish:
			case typeDisconnect:
				if !v5 {
					t.Fatalf("a 3.1.1 DISCONNECT taken")
				}
			default:
				t.Fatalf("packet type %d taken", in.kind)
			}
		}
	})
}

// FuzzConnack reads an answer to the CONNECT of either version (v5): it
// never panics, and an accepted connection has no session present.
func FuzzConnack(f *testing.F) {
	f.Add(false, []byte{0x20, 2, 0, 0})
	f.Add(false, []byte{0x20, 2, 1, 0})
	f.Add(true, []byte{0x20, 3, 0, 0, 0})
	f.Add(true, []byte{0x20, 6, 0, 0, 3, 0x21, 0, 0})
	f.Add(true, []byte{0x20, 0xFF, 0xFF, 0xFF, 0x7F})
	f.Fuzz(func(t *testing.T, v5 bool, stream []byte) {
		if !v5 {
			code, err := readConnack311(bytes.NewReader(stream))
			if err == nil && code == 0 && stream[2] != 0 {
				t.Fatalf("CONNACK % X accepted with a session present", stream)
			}
			return
		}
		cp, err := readConnack5(bytes.NewReader(stream))
		if err != nil {
			return
		}
		if ca, ok := cp.Content.(*packets.Connack); ok && ca.ReasonCode < 0x80 {
			props := ca.Properties
			if props == nil {
				props = &packets.Properties{}
			}
			if checkConnack5(ca, props) == nil && (ca.SessionPresent ||
				props.ReceiveMaximum != nil && *props.ReceiveMaximum == 0) {
				t.Fatalf("CONNACK % X accepted", stream)
			}
		}
	})
}

// FuzzParseURL: whatever an operator types as a broker URL, ParseURL
// either refuses it or returns one a connection can dial: a known scheme,
// a host, a port from 1 to 65535, and no user, path, query or fragment.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"tcp://127.0.0.1:1883", "127.0.0.1:1883", "localhost:1883", "tcp://h:99999", "mqtt://h:1883/p", "ssl://u:p@h:8883", "tls://[::1]:8883", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURL(s)
		if err != nil {
			return
		}
		port, perr := strconv.Atoi(u.Port())
		if u.Hostname() == "" || perr != nil || port < 1 || port > 65535 || u.User != nil ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			t.Fatalf("%q accepted as %#v", s, u)
		}
		switch strings.ToLower(u.Scheme) {
		case "tcp", "mqtt", "ssl", "tls", "mqtts":
		default:
			t.Fatalf("%q accepted with scheme %q", s, u.Scheme)
		}
	})
}

// FuzzSubscribe5Stream feeds a stream of bytes from a broker, in reads of
// any size, to the MQTT 5 subscriber's reader (firstBytes, whose
// publishCheck reads ahead of paho) and to paho's packet reader behind it:
// it never panics, keeps no more of a packet than its length, hands paho no
// packet over the limit (refused before paho has its Remaining Length),
// and every PUBLISH that reaches paho carries each of Response Topic,
// Correlation Data and Message Expiry at most once, within the packet,
// with the value paho decoded. With v311 the check reads as the 3.1.1
// subscriber's does (sizes only).
func FuzzSubscribe5Stream(f *testing.F) {
	publish := func(props ...byte) []byte {
		body := append([]byte{0, 1, 'c', 0, 7}, appendVarint(nil, len(props))...)
		body = append(append(body, props...), `{"id":"1"}`...)
		return append(append([]byte{0x32}, appendVarint(nil, len(body))...), body...)
	}
	f.Add(uint8(0), publish(0x08, 0, 1, 'r', 0x09, 0, 2, 0xAB, 0xCD, 0x02, 0, 0, 0, 5))
	f.Add(uint8(2), publish(0x08, 0, 1, 'r', 0x08, 0, 1, 's'))
	f.Add(uint8(1), publish(0x26, 0, 1, 'k', 0, 1, 'v', 0x26, 0, 1, 'k', 0, 1, 'w', 0x0B, 1, 0x0B, 2))
	f.Add(uint8(7), []byte{0x20, 3, 0, 0, 0, 0x32, 8, 0, 1, 'c', 0, 7, 10, 0x09, 0, 8})
	f.Add(uint8(0), []byte{0x30, 4, 0, 1, 'c', 0, 0x90, 0, 0xD0, 0})
	f.Add(uint8(3), []byte{0x20, 3, 0, 0, 0, 0x32, 0xFF, 0xFF, 0xFF, 0x7F})
	f.Add(uint8(0x83), []byte{0x20, 2, 0, 0, 0x32, 0x80, 0x80, 0x04})
	f.Fuzz(func(t *testing.T, step uint8, stream []byte) {
		// A limit small enough that the fuzzer reaches it: paho would
		// allocate whatever a Remaining Length claims, up to 256 MiB.
		const limit = 1 << 16
		v311 := step&0x80 != 0
		r := &pieces{data: stream, step: int(step%16) + 1}
		fb := &firstBytes{Conn: readOnlyConn{r}, check: publishCheck{max: limit, v311: v311}}
		for {
			start := r.pos
			cp, err := packets.ReadPacket(fb)
			if len(fb.check.head) > r.pos-start {
				t.Fatalf("the check holds %d bytes of a packet of %d read so far", len(fb.check.head), r.pos-start)
			}
			if r.pos-start > limit {
				t.Fatalf("paho read %d bytes of a packet, over the limit of %d", r.pos-start, limit)
			}
			if err != nil {
				return
			}
			pb, ok := cp.Content.(*packets.Publish)
			if !ok || v311 {
				continue
			}
			rt, cd, me := rawRequestProperties(t, stream[start:r.pos])
			got := pb.Properties
			if rt != got.ResponseTopic || !bytes.Equal(cd, got.CorrelationData) ||
				(me == nil) != (got.MessageExpiry == nil) || me != nil && *me != *got.MessageExpiry {
				t.Fatalf("PUBLISH % X: paho read %q %x %v", stream[start:r.pos], got.ResponseTopic, got.CorrelationData, got.MessageExpiry)
			}
		}
	})
}

// rawRequestProperties reads Response Topic, Correlation Data and Message
// Expiry from a whole MQTT 5 PUBLISH packet's bytes, failing t if its
// properties run past it or one of those three is given twice.
func rawRequestProperties(t *testing.T, pkt []byte) (rt string, cd []byte, me *uint32) {
	t.Helper()
	_, w, err := readVarint(pkt[1:])
	if err != nil {
		t.Fatalf("PUBLISH % X: %v", pkt, err)
	}
	body := pkt[1+w:]
	at, end, err := publishHead(pkt[0], body)
	if err != nil || at == 0 || end > len(body) {
		t.Fatalf("PUBLISH % X passed with properties past its end", pkt)
	}
	_, w, _ = readVarint(body[at:])
	b := body[at+w : end]
	seen := map[byte]bool{}
	for len(b) > 0 {
		id := b[0]
		b = b[1:]
		var size int
		switch id {
		case 0x01:
			size = 1
		case 0x23:
			size = 2
		case 0x02:
			size = 4
			v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
			me = &v
		case 0x0B:
			_, size, _ = readVarint(b)
		case 0x03, 0x08, 0x09:
			size, _ = stringSize(b)
			if id == 0x08 {
				rt = string(b[2:size])
			} else if id == 0x09 {
				cd = b[2:size]
			}
		case 0x26:
			k, _ := stringSize(b)
			v, _ := stringSize(b[k:])
			size = k + v
		default:
			t.Fatalf("PUBLISH % X passed with property 0x%02X", pkt, id)
		}
		if (id == 0x02 || id == 0x08 || id == 0x09) && seen[id] {
			t.Fatalf("PUBLISH % X passed with property 0x%02X twice", pkt, id)
		}
		seen[id] = true
		b = b[size:]
	}
	return rt, cd, me
}

// pieces reads data at most step bytes at a time, counting what it gave.
type pieces struct {
	data []byte
	step int
	pos  int
}

func (p *pieces) Read(b []byte) (int, error) {
	if p.pos == len(p.data) {
		return 0, io.EOF
	}
	n := copy(b[:min(len(b), p.step)], p.data[p.pos:])
	p.pos += n
	return n, nil
}

// readOnlyConn is a net.Conn that only reads.
type readOnlyConn struct{ io.Reader }

func (c readOnlyConn) Read(b []byte) (int, error)     { return c.Reader.Read(b) }
func (readOnlyConn) Write(b []byte) (int, error)      { return len(b), nil }
func (readOnlyConn) Close() error                     { return nil }
func (readOnlyConn) LocalAddr() net.Addr              { return nil }
func (readOnlyConn) RemoteAddr() net.Addr             { return nil }
func (readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (readOnlyConn) SetWriteDeadline(time.Time) error { return nil }
