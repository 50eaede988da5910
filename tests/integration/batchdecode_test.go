package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/compress"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// A test-only reader of the relay's structured messages, batched or not,
// compressed or not (docs/batching.md), for the crash and power-loss tests
// until the library's own decoder of a message's events (DecodeEventsMQTT)
// is there to call instead. It is strict where the relay must be: over
// MQTT 5 a compressed payload carries its content-encoding and a batch its
// Content Type; over 3.1.1 the magic bytes and the '[' say them.

const (
	batchContentType   = "application/cloudevents-batch+json"
	contentEncodingKey = "content-encoding"
)

// wireMessage is what one MQTT message carried.
type wireMessage struct {
	events     []outbox.Event
	compressed bool
}

// decodeWire decodes every event of m, in order.
func decodeWire(m harness.Message) (wireMessage, error) {
	var w wireMessage
	// Over MQTT 5 every structured message has a Content Type: none means
	// 3.1.1, where nothing but the payload can say anything.
	v5 := m.ContentType != ""
	var said string
	var user []outbox.UserProperty
	for _, u := range m.User {
		if u.Key == contentEncodingKey {
			if said != "" {
				return w, errors.New("content-encoding given twice")
			}
			said = u.Val
			continue
		}
		user = append(user, outbox.UserProperty{Key: u.Key, Value: u.Val})
	}
	payload := m.Payload
	sniffed := compress.Sniff(payload)
	switch {
	case v5 && said != "" && sniffed == compress.None:
		return w, fmt.Errorf("content-encoding %q on a payload that is no %s frame", said, said)
	case v5 && said == "" && sniffed != compress.None:
		return w, fmt.Errorf("a %s payload over MQTT 5 without its content-encoding", sniffed)
	case !v5 && said != "":
		return w, errors.New("content-encoding without a Content Type")
	}
	if sniffed != compress.None {
		if said != "" {
			alg, err := compress.Parse(said)
			if err != nil || alg != sniffed {
				return w, fmt.Errorf("content-encoding %q on a %s payload", said, sniffed)
			}
		}
		var err error
		if payload, err = compress.Decompress(sniffed, payload, outbox.MaxBatchBytesLimit); err != nil {
			return w, fmt.Errorf("%s: %w", sniffed, err)
		}
		w.compressed = true
	}
	array := len(payload) > 0 && payload[0] == '['
	if v5 && array != (m.ContentType == batchContentType) {
		return w, fmt.Errorf("Content Type %q on a payload that begins %q", m.ContentType, payload[:min(len(payload), 1)])
	}
	if !array {
		ev, err := outbox.DecodeEventMQTT(payload, m.ContentType, user)
		w.events = []outbox.Event{ev}
		return w, err
	}
	var docs []json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(payload))
	if err := dec.Decode(&docs); err != nil {
		return w, fmt.Errorf("batch: %w", err)
	}
	if dec.More() {
		return w, errors.New("batch: bytes after the array")
	}
	if len(docs) == 0 {
		return w, errors.New("batch: no events")
	}
	for i, d := range docs {
		ev, err := outbox.DecodeEvent(d)
		if err != nil {
			return w, fmt.Errorf("batch event %d: %w", i, err)
		}
		w.events = append(w.events, ev)
	}
	return w, nil
}
