package outbox

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/edgeoutbox/outbox/internal/compress"
)

// DecodeEvent parses a CloudEvents structured-mode JSON document as written
// by the relay (and by other CloudEvents producers). It requires
// specversion 1.0 and non-empty id, source and type.
func DecodeEvent(b []byte) (Event, error) {
	var raw struct {
		SpecVersion     string          `json:"specversion"`
		ID              string          `json:"id"`
		Source          string          `json:"source"`
		Type            string          `json:"type"`
		Time            string          `json:"time"`
		DataContentType string          `json:"datacontenttype"`
		Data            json.RawMessage `json:"data"`
		DataBase64      *string         `json:"data_base64"`
		Sequence        string          `json:"sequence"`
		CorrelationData string          `json:"correlationdata"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return Event{}, fmt.Errorf("outbox: decode event: %w", err)
	}
	if raw.SpecVersion != "1.0" {
		return Event{}, fmt.Errorf("outbox: decode event: unsupported specversion %q", raw.SpecVersion)
	}
	if raw.ID == "" || raw.Source == "" || raw.Type == "" {
		return Event{}, fmt.Errorf("outbox: decode event: id, source and type are required")
	}
	ev := Event{ID: raw.ID, Source: raw.Source, Type: raw.Type, DataContentType: raw.DataContentType}
	if raw.Time != "" {
		t, err := time.Parse(time.RFC3339Nano, raw.Time)
		if err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: time: %w", err)
		}
		ev.Time = t
	}
	if raw.Sequence != "" {
		n, err := strconv.ParseInt(raw.Sequence, 10, 64)
		if err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: sequence: %w", err)
		}
		ev.Sequence = n
	}
	cd, err := decodeCorrelation(raw.CorrelationData)
	if err != nil {
		return Event{}, err
	}
	ev.CorrelationData = cd
	switch {
	case raw.DataBase64 != nil && raw.Data != nil:
		return Event{}, fmt.Errorf("outbox: decode event: both data and data_base64")
	case raw.DataBase64 != nil:
		d, err := base64.StdEncoding.DecodeString(*raw.DataBase64)
		if err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: data_base64: %w", err)
		}
		ev.Data = d
	case len(raw.Data) > 0 && raw.Data[0] == '"' && raw.DataContentType != "" && !isJSONContentType(raw.DataContentType):
		// The CloudEvents JSON format: a string of a non-JSON content
		// type carries the data itself (an absent content type means
		// JSON, whose data is the JSON value, quotes and all).
		var text string
		if err := json.Unmarshal(raw.Data, &text); err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: data: %w", err)
		}
		ev.Data = []byte(text)
	case raw.Data != nil:
		ev.Data = []byte(raw.Data)
	}
	return ev, nil
}

// DecodeEventMQTT parses an event received over MQTT, in either content
// mode of the CloudEvents MQTT binding: binary mode when the user
// properties carry specversion (the payload is the data, contentType its
// datacontenttype, and the other attributes user properties named by the
// attribute), else structured mode, as DecodeEvent. A payload whose
// content-encoding user property says gzip or zstd is decompressed first
// (docs/batching.md), bounded by MaxBatchBytesLimit; nothing else of
// batching is read: DecodeEventsMQTT reads every form the relay writes.
// A message over MQTT 3.1.1 has no properties: pass "" and nil. Binary
// mode's Event.Data is payload itself (or its decompression), not a copy.
// It requires specversion 1.0 and non-empty id, source and type in either
// mode; an attribute given twice is an error, and user properties that are
// not attributes the Event holds are ignored.
func DecodeEventMQTT(payload []byte, contentType string, user []UserProperty) (Event, error) {
	payload, _, err := decompressed(payload, user)
	if err != nil {
		return Event{}, fmt.Errorf("outbox: decode event: %w", err)
	}
	return decodeEventMQTT(payload, contentType, user)
}

// decodeEventMQTT is DecodeEventMQTT of a payload already decompressed.
func decodeEventMQTT(payload []byte, contentType string, user []UserProperty) (Event, error) {
	var attrs [7]*string // specversion, id, source, type, time, sequence, correlationdata
	for i := range user {
		k := -1
		switch user[i].Key {
		case "specversion":
			k = 0
		case "id":
			k = 1
		case "source":
			k = 2
		case "type":
			k = 3
		case "time":
			k = 4
		case "sequence":
			k = 5
		case "correlationdata":
			k = 6
		}
		if k < 0 {
			continue
		}
		if attrs[k] != nil {
			return Event{}, fmt.Errorf("outbox: decode event: attribute %q given twice", user[i].Key)
		}
		attrs[k] = &user[i].Value
	}
	if attrs[0] == nil {
		return DecodeEvent(payload)
	}
	get := func(k int) string {
		if attrs[k] == nil {
			return ""
		}
		return *attrs[k]
	}
	if v := get(0); v != "1.0" {
		return Event{}, fmt.Errorf("outbox: decode event: unsupported specversion %q", v)
	}
	ev := Event{ID: get(1), Source: get(2), Type: get(3), DataContentType: contentType, Data: payload}
	if ev.ID == "" || ev.Source == "" || ev.Type == "" {
		return Event{}, fmt.Errorf("outbox: decode event: id, source and type are required")
	}
	if v := get(4); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: time: %w", err)
		}
		ev.Time = t
	}
	if v := get(5); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: sequence: %w", err)
		}
		ev.Sequence = n
	}
	var err error
	if ev.CorrelationData, err = decodeCorrelation(get(6)); err != nil {
		return Event{}, err
	}
	return ev, nil
}

// decodeCorrelation decodes the correlationdata extension: base64 (std,
// padded) of at most 65,535 bytes, MQTT's binary data; nil when absent.
func decodeCorrelation(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	if len(s) > base64.StdEncoding.EncodedLen(maxBinaryBytes) {
		return nil, fmt.Errorf("outbox: decode event: correlationdata: longer than %d bytes", maxBinaryBytes)
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("outbox: decode event: correlationdata: %w", err)
	}
	return b, nil
}

// maxBatchEvents bounds the events of one batch a decoder accepts: the
// relay's BatchOptions.MaxEvents is at most this.
const maxBatchEvents = 65535

// EventPart is one event of a message and the bytes it was decoded from.
type EventPart struct {
	Event Event
	// Bytes are what Event was decoded from: its JSON document in a
	// structured batch; for a single event the payload, decompressed
	// (binary mode's data). A consumer that cannot apply the event keeps
	// them.
	Bytes []byte
}

// DecodeEventsMQTT returns the events of a message received over MQTT, in
// any form the relay writes (docs/batching.md): a single event in either
// content mode, as DecodeEventMQTT; a structured batch, a JSON array of
// structured-mode documents, told by its Content Type
// (application/cloudevents-batch+json) or, without one (MQTT 3.1.1), by
// its first byte '['; either compressed, said by the content-encoding user
// property or, for a structured payload without it, by the gzip or zstd
// magic bytes. A binary-mode payload is never sniffed: its data may be the
// application's own gzip. Decompression is bounded by MaxBatchBytesLimit,
// as is a batch, which must hold 1 to 65,535 events, each of which must
// decode; the events come in the batch's order, which is commit order.
// Over MQTT 3.1.1 pass "" and nil.
func DecodeEventsMQTT(payload []byte, contentType string, user []UserProperty) ([]Event, error) {
	parts, err := DecodeEventPartsMQTT(payload, contentType, user)
	if err != nil {
		return nil, err
	}
	evs := make([]Event, len(parts))
	for i := range parts {
		evs[i] = parts[i].Event
	}
	return evs, nil
}

// DecodeEventPartsMQTT is DecodeEventsMQTT that also returns the bytes
// each event was decoded from.
func DecodeEventPartsMQTT(payload []byte, contentType string, user []UserProperty) ([]EventPart, error) {
	p, said, err := decompressed(payload, user)
	if err != nil {
		return nil, fmt.Errorf("outbox: decode event: %w", err)
	}
	if binaryMode(user) {
		ev, err := decodeEventMQTT(p, contentType, user)
		if err != nil {
			return nil, err
		}
		return []EventPart{{ev, p}}, nil
	}
	mt := mediaType(contentType)
	if mt == rawBatchContentType {
		return nil, errors.New("outbox: decode event: a raw batch holds no CloudEvents (DecodeRawMQTT reads it)")
	}
	if alg := compress.Sniff(p); !said && alg != compress.None {
		// No property (MQTT 3.1.1 has none): the magic bytes, with
		// which no JSON document begins.
		if p, err = compress.Decompress(alg, p, MaxBatchBytesLimit); err != nil {
			return nil, fmt.Errorf("outbox: decode event: %w", err)
		}
	}
	if mt == batchContentType || mt == "" && len(p) > 0 && p[0] == '[' {
		return decodeBatch(p, maxBatchEvents)
	}
	ev, err := DecodeEvent(p)
	if err != nil {
		return nil, err
	}
	return []EventPart{{ev, p}}, nil
}

// decodeBatch decodes a structured batch of at most most events; every
// event must decode.
func decodeBatch(p []byte, most int) ([]EventPart, error) {
	if len(p) > MaxBatchBytesLimit {
		return nil, fmt.Errorf("outbox: decode batch: %d bytes, over MaxBatchBytesLimit", len(p))
	}
	dec := json.NewDecoder(bytes.NewReader(p))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, errors.New("outbox: decode batch: not a JSON array")
	}
	var parts []EventPart
	for dec.More() {
		if len(parts) == most {
			return nil, fmt.Errorf("outbox: decode batch: more than %d events", most)
		}
		var doc json.RawMessage
		if err := dec.Decode(&doc); err != nil {
			return nil, fmt.Errorf("outbox: decode batch: event %d: %w", len(parts)+1, err)
		}
		ev, err := DecodeEvent(doc)
		if err != nil {
			return nil, fmt.Errorf("%w (event %d of a batch)", err, len(parts)+1)
		}
		parts = append(parts, EventPart{ev, doc})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("outbox: decode batch: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("outbox: decode batch: more after the array")
	}
	if len(parts) == 0 {
		return nil, errors.New("outbox: decode batch: no events")
	}
	return parts, nil
}

// DecodeRawMQTT returns the payloads of a message the relay published with
// EnvelopeRaw (docs/batching.md): a raw batch's (Content Type
// application/vnd.edgeoutbox.raw-batch: each payload after its length as
// an unsigned LEB128 varint), or else the payload itself, either
// decompressed first where the content-encoding user property says so,
// bounded by MaxBatchBytesLimit. A raw batch holds 1 to 65,535 payloads.
// Nothing else says anything: a raw payload is the application's own
// bytes, whatever they begin with. Over MQTT 3.1.1, which carries no
// properties, the payload is the one payload: pass "" and nil.
func DecodeRawMQTT(payload []byte, contentType string, user []UserProperty) ([][]byte, error) {
	p, _, err := decompressed(payload, user)
	if err != nil {
		return nil, fmt.Errorf("outbox: decode raw: %w", err)
	}
	if mediaType(contentType) != rawBatchContentType {
		return [][]byte{p}, nil
	}
	if len(p) > MaxBatchBytesLimit {
		return nil, fmt.Errorf("outbox: decode raw batch: %d bytes, over MaxBatchBytesLimit", len(p))
	}
	var out [][]byte
	for len(p) > 0 {
		if len(out) == maxBatchEvents {
			return nil, fmt.Errorf("outbox: decode raw batch: more than %d payloads", maxBatchEvents)
		}
		n, k := binary.Uvarint(p)
		if k <= 0 {
			return nil, fmt.Errorf("outbox: decode raw batch: payload %d: a truncated or overlong length", len(out)+1)
		}
		p = p[k:]
		if n > uint64(len(p)) {
			return nil, fmt.Errorf("outbox: decode raw batch: payload %d: %d bytes, %d left", len(out)+1, n, len(p))
		}
		out = append(out, p[:n:n])
		p = p[n:]
	}
	if len(out) == 0 {
		return nil, errors.New("outbox: decode raw batch: no payloads")
	}
	return out, nil
}

// decompressed returns payload decompressed as its content-encoding user
// property says, bounded by MaxBatchBytesLimit, and whether it said.
func decompressed(payload []byte, user []UserProperty) (p []byte, said bool, err error) {
	var enc *string
	for i := range user {
		if user[i].Key != contentEncodingKey {
			continue
		}
		if enc != nil {
			return nil, true, fmt.Errorf("%s given twice", contentEncodingKey)
		}
		enc = &user[i].Value
	}
	if enc == nil {
		return payload, false, nil
	}
	alg, err := compress.Parse(*enc)
	if err != nil || alg == compress.None {
		return payload, true, err
	}
	p, err = compress.Decompress(alg, payload, MaxBatchBytesLimit)
	return p, true, err
}

// binaryMode reports whether the user properties carry CloudEvents binary
// mode's attributes.
func binaryMode(user []UserProperty) bool {
	for _, u := range user {
		if u.Key == "specversion" {
			return true
		}
	}
	return false
}

// mediaType is a content type without its parameters, in lower case.
func mediaType(ct string) string {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}
