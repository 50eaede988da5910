package outbox

import (
	"crypto/rand"
	"encoding/hex"
	"time"
)

// NewID returns a new version 7 UUID in its canonical lower-case text form:
// 48 bits of Unix milliseconds followed by 74 random bits. Ids sort roughly by
// creation time, but order is never taken from them (device clocks jump);
// they exist so that consumers can recognise a redelivered event.
//
// Set Message.ID to an id from NewID when the caller needs to know the id
// before the transaction commits.
func NewID() string {
	return newIDAt(time.Now())
}

func newIDAt(t time.Time) string {
	var b [16]byte
	if _, err := rand.Read(b[6:]); err != nil {
		panic("outbox: crypto/rand failed: " + err.Error())
	}
	ms := uint64(t.UnixMilli())
	b[0] = byte(ms >> 40)
	b[1] = byte(ms >> 32)
	b[2] = byte(ms >> 24)
	b[3] = byte(ms >> 16)
	b[4] = byte(ms >> 8)
	b[5] = byte(ms)
	b[6] = b[6]&0x0f | 0x70 // version 7
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}
