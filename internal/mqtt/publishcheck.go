package mqtt

import (
	"errors"
	"sync"
)

// The subscriber's MQTT 5 packets are decoded by paho.golang's packets,
// which takes a property given twice (the last one wins) and a property
// block that runs past its PUBLISH (it reads what is there). What a
// subscriber hands over from a PUBLISH's properties (a command's Response
// Topic, Correlation Data, Message Expiry) must be what the broker sent and
// nothing else. publishCheck reads the byte stream paho reads, ahead of it,
// and refuses a PUBLISH whose properties break MQTT 5 (readProperties'
// rules) before paho has seen its last byte: the connection ends, as for any
// packet paho cannot decode, and the message comes again on the next one.
// It is the broker's fault, never the message's: a broker re-encodes the
// properties it forwards.
//
// The same reading bounds every packet of either version's subscriber
// (max): paho allocates whatever a Remaining Length claims, up to 256 MiB,
// so a packet declared larger than the limit is refused as soon as its
// Remaining Length is read, before paho has that length, let alone the body.

// The states of publishCheck: what the next byte of the stream is.
const (
	checkHeader = iota // a packet's first byte
	checkLength        // a byte of its Remaining Length
	checkHead          // a byte of a PUBLISH before the end of its properties
	checkBody          // any other byte of a packet
)

// publishCheck follows the packets of a stream, refuses one larger than
// max and checks each MQTT 5 PUBLISH's properties. It keeps no more than a
// PUBLISH's topic, packet id and properties, which paho holds anyway.
type publishCheck struct {
	max  int  // the largest packet taken, its fixed header included; 0: any
	v311 bool // the stream is MQTT 3.1.1's: a PUBLISH has no properties

	state  int
	first  byte // the packet's first byte
	length int  // its Remaining Length (while checkLength: so far)
	shift  int  // the next Remaining Length byte's shift
	left   int  // the bytes of its body not yet seen
	head   []byte

	mu  sync.Mutex // for because, from another goroutine; scan's own reads need none
	err error      // once refused, every later read is
}

// scan follows p, the next bytes of the stream; an error (a ProtocolError)
// means a packet they end or continue is malformed, or too large.
func (c *publishCheck) scan(p []byte) error {
	if c.err != nil {
		return c.err
	}
	if err := c.follow(p); err != nil {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
	}
	return c.err
}

// because is err, or what the check refused the stream for if it did. A
// connection it ended fails paho's calls under way with errors of their
// own ("not Connected", "connection lost before Subscribe completed"),
// which say nothing of why; the session reports the why.
func (c *publishCheck) because(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	return err
}

func (c *publishCheck) follow(p []byte) error {
	for len(p) > 0 || c.state == checkHead {
		switch c.state {
		case checkHeader:
			c.first, c.length, c.shift = p[0], 0, 0
			c.state, p = checkLength, p[1:]
		case checkLength:
			b := p[0]
			p = p[1:]
			c.length |= int(b&0x7f) << c.shift
			c.shift += 7
			if b&0x80 != 0 {
				if c.shift == 28 {
					return protocolError(c.v311, "malformed Remaining Length (more than 4 bytes)")
				}
				continue
			}
			if size := 1 + c.shift/7 + c.length; c.max > 0 && size > c.max {
				return protocolError(c.v311, "a %s of %d bytes, over the subscriber's limit of %d (MaxPacketBytes)",
					packetName(c.first), size, c.max)
			}
			c.left, c.state = c.length, checkBody
			if c.first>>4 == typePublish && !c.v311 {
				c.state = checkHead
			} else if c.left == 0 {
				c.state = checkHeader
			}
		case checkHead:
			at, end, err := publishHead(c.first, c.head)
			if err == nil && end > c.length {
				err = errPastEnd
			}
			if err != nil {
				return protocolError(false, "malformed PUBLISH: %v", err)
			}
			if at > 0 && len(c.head) >= end {
				if _, err := readProperties(c.head[at:end], false, publishProperties); err != nil {
					return protocolError(false, "malformed PUBLISH: %v", err)
				}
				c.head, c.state = c.head[:0], checkBody
				if c.left == 0 {
					c.state = checkHeader
				}
				continue
			}
			if len(p) == 0 {
				return nil
			}
			n := min(end-len(c.head), len(p))
			c.head = append(c.head, p[:n]...)
			c.left -= n
			p = p[n:]
		case checkBody:
			n := min(c.left, len(p))
			c.left -= n
			p = p[n:]
			if c.left == 0 {
				c.state = checkHeader
			}
		}
	}
	return nil
}

var errPastEnd = errors.New("its topic, packet id or properties run past its end")

// publishHead reads what b, the first bytes of a PUBLISH's body (first is
// its first byte), says of its properties: they are b[at:end] (their length
// included). While b is too short to say, at is 0 and end is how many bytes
// b needs to say more.
func publishHead(first byte, b []byte) (at, end int, err error) {
	qos := first >> 1 & 3
	if qos == 3 {
		return 0, 0, errors.New("QoS 3")
	}
	if len(b) < 2 {
		return 0, 2, nil
	}
	n := 2 + (int(b[0])<<8 | int(b[1]))
	if qos > 0 {
		n += 2
	}
	if len(b) <= n {
		return 0, n + 1, nil
	}
	size, w, err := readVarint(b[n:])
	if err == errTruncated {
		return 0, len(b) + 1, nil
	}
	if err != nil {
		return 0, 0, err
	}
	return n, n + w + size, nil
}
