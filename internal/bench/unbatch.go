package bench

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/compress"
)

// unpack returns a message's payload as the relay encoded it before
// compression: a compressed one, told by its magic bytes (as over MQTT
// 3.1.1), decompressed within the bound every decoder applies.
func unpack(p []byte) ([]byte, error) {
	alg := compress.Sniff(p)
	if alg == compress.None {
		return p, nil
	}
	return compress.Decompress(alg, p, outbox.MaxBatchBytesLimit)
}

// seqsOf returns the sequences of the structured events a message
// carries, in order: one for an event, each of a batch's. A batch is a
// JSON array; more than one event in anything else is an error.
func seqsOf(p []byte) ([]int64, error) {
	p, err := unpack(p)
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

// messageTracker counts the MQTT messages of a drain and hands each event
// they carry to an orderTracker; a message it cannot decode is counted, and
// its events are missing.
type messageTracker struct {
	tr        *orderTracker
	messages  atomic.Int64
	malformed atomic.Int64
}

func (m *messageTracker) handle(_ string, payload []byte) {
	now := time.Now()
	m.messages.Add(1)
	seqs, err := seqsOf(payload)
	if err != nil {
		m.malformed.Add(1)
		return
	}
	for _, s := range seqs {
		m.tr.record(s, now)
	}
}
