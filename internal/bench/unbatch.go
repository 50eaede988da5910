package bench

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/compress"
)

// unpacker undoes the relay's compression for the bench's subscribers. It
// keeps one zstd decoder: they run in the broker's delivery path, before
// its PUBACK, where a decoder made per message (compress.Decompress's, a
// consumer's safeguard against untrusted payloads) would cost more than
// the relay's compression and be counted against it.
type unpacker struct {
	zd *zstd.Decoder
}

func newUnpacker() (*unpacker, error) {
	zd, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(2), zstd.WithDecoderMaxMemory(outbox.MaxBatchBytesLimit))
	if err != nil {
		return nil, err
	}
	return &unpacker{zd: zd}, nil
}

func (u *unpacker) close() { u.zd.Close() }

// unpack returns a message's payload as the relay encoded it before
// compression: a compressed one, told by its magic bytes (as over MQTT
// 3.1.1), decompressed.
func (u *unpacker) unpack(p []byte) ([]byte, error) {
	switch compress.Sniff(p) {
	case compress.Zstd:
		return u.zd.DecodeAll(p, nil)
	case compress.Gzip:
		return compress.Decompress(compress.Gzip, p, outbox.MaxBatchBytesLimit)
	}
	return p, nil
}

// seqsOf returns the sequences of the structured events a message
// carries, in order: one for an event, each of a batch's. A batch is a
// JSON array; more than one event in anything else is an error.
func (u *unpacker) seqsOf(p []byte) ([]int64, error) {
	p, err := u.unpack(p)
	if err != nil {
		return nil, err
	}
	var out []int64
	for rest := p; ; {
		i := bytes.Index(rest, seqKey)
		if i < 0 {
			break
		}
		out = append(out, parseSeq(rest[i:]))
		rest = rest[i+len(seqKey):]
	}
	if len(out) == 0 || len(out) > 1 && (len(p) == 0 || p[0] != '[') {
		return nil, fmt.Errorf("a message of %d bytes with %d events, beginning %q", len(p), len(out), p[:min(len(p), 8)])
	}
	return out, nil
}

// orders returns the order numbers of the events a message carries; none
// if it cannot be decompressed.
func (u *unpacker) orders(p []byte) []int {
	p, err := u.unpack(p)
	if err != nil {
		return nil
	}
	return orderNumbers(p)
}

// messageTracker counts the MQTT messages of a drain and hands each event
// they carry to an orderTracker; a message it cannot decode is counted, and
// its events are missing.
type messageTracker struct {
	tr        *orderTracker
	u         *unpacker
	messages  atomic.Int64
	malformed atomic.Int64
}

func (m *messageTracker) handle(_ string, payload []byte) {
	now := time.Now()
	m.messages.Add(1)
	seqs, err := m.u.seqsOf(payload)
	if err != nil {
		m.malformed.Add(1)
		return
	}
	for _, s := range seqs {
		m.tr.record(s, now)
	}
}
