package outbox

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Envelope selects what the relay puts on the wire.
type Envelope int

const (
	// EnvelopeCloudEvents (the default) publishes each message as a
	// CloudEvents 1.0 structured-mode JSON document, the only mode the
	// CloudEvents MQTT binding allows for MQTT 3.1.1. It carries the id,
	// source, type, time, content type, data and the sequence number.
	EnvelopeCloudEvents Envelope = iota
	// EnvelopeRaw publishes the payload bytes untouched. The event id is
	// then not on the wire, so consumers cannot dedupe by it.
	EnvelopeRaw
)

// String returns "cloudevents" or "raw".
func (e Envelope) String() string {
	if e == EnvelopeRaw {
		return "raw"
	}
	return "cloudevents"
}

// ParseEnvelope parses "cloudevents" or "raw".
func ParseEnvelope(s string) (Envelope, error) {
	switch strings.ToLower(s) {
	case "cloudevents", "ce", "":
		return EnvelopeCloudEvents, nil
	case "raw":
		return EnvelopeRaw, nil
	}
	return 0, fmt.Errorf("outbox: unknown envelope %q (want cloudevents or raw)", s)
}

// DefaultEventType is the CloudEvents type of a message written without one.
const DefaultEventType = "outbox.event"

// Event is a decoded CloudEvents envelope as written by the relay.
type Event struct {
	ID              string
	Source          string
	Type            string
	Time            time.Time
	DataContentType string
	// Data is the payload as enqueued: inline JSON data verbatim, the text
	// of a string data whose content type is not JSON, or the decoded
	// data_base64.
	Data []byte
	// Sequence is the outbox sequence number (the "sequence" extension):
	// commit order within one source.
	Sequence int64
}

// outgoing is one row read for publishing.
type outgoing struct {
	seq         int64
	id          string
	topic       string
	payload     []byte
	text        bool // SQLite stores the payload as TEXT, as plain-SQL writers often do
	typ         string
	contentType string
	createdAt   int64 // Unix ms
	attempts    int
}

// encoder builds the bytes to publish.
type encoder struct {
	prefix      string // topics must start with it
	mode        Envelope
	source      string
	defaultType string
}

// errPermanent marks a failure that retrying cannot fix.
var errPermanent = errors.New("permanent")

// sequenceDigits zero-pads the sequence extension: the CloudEvents
// sequence extension is a string compared lexicographically.
const sequenceDigits = 20

func (e *encoder) encode(dst []byte, m *outgoing) ([]byte, error) {
	if err := ValidateTopic(m.topic); err != nil {
		return nil, fmt.Errorf("%w: %w", errPermanent, err)
	}
	if !strings.HasPrefix(m.topic, e.prefix) {
		return nil, fmt.Errorf("%w: %w: %q is not under %q", errPermanent, ErrTopicOutsidePrefix, m.topic, e.prefix)
	}
	if e.mode == EnvelopeRaw {
		return append(dst, m.payload...), nil
	}
	typ := m.typ
	if typ == "" {
		typ = e.defaultType
	}
	for _, s := range []string{m.id, typ, m.contentType} {
		if !utf8.ValidString(s) {
			return nil, fmt.Errorf("%w: id, type or content type is not valid UTF-8", errPermanent)
		}
	}
	if m.id == "" {
		return nil, fmt.Errorf("%w: empty id", errPermanent)
	}
	ct := m.contentType
	inline, str := false, false
	switch {
	case ct == "":
		switch {
		case json.Valid(m.payload):
			ct, inline = "application/json", true
		case m.text && utf8.Valid(m.payload):
			// A writer that stored text meant text; a BLOB stays bytes
			// even when they happen to be text.
			ct, str = "text/plain; charset=utf-8", true
		default:
			ct = "application/octet-stream"
		}
	case isJSONContentType(ct):
		inline = json.Valid(m.payload)
	}
	dst = append(dst, `{"specversion":"1.0","id":`...)
	dst = appendJSONString(dst, m.id)
	dst = append(dst, `,"source":`...)
	dst = appendJSONString(dst, e.source)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, typ)
	dst = append(dst, `,"time":"`...)
	dst = time.UnixMilli(m.createdAt).UTC().AppendFormat(dst, "2006-01-02T15:04:05.000Z07:00")
	dst = append(dst, `","datacontenttype":`...)
	dst = appendJSONString(dst, ct)
	dst = append(dst, `,"sequence":"`...)
	seq := strconv.AppendInt(nil, m.seq, 10)
	for i := len(seq); i < sequenceDigits; i++ {
		dst = append(dst, '0')
	}
	dst = append(dst, seq...)
	dst = append(dst, '"')
	switch {
	case inline:
		dst = append(dst, `,"data":`...)
		dst = append(dst, m.payload...)
	case str:
		dst = append(dst, `,"data":`...)
		dst = appendJSONString(dst, m.payload)
	default:
		dst = append(dst, `,"data_base64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, m.payload)
		dst = append(dst, '"')
	}
	return append(dst, '}'), nil
}

func isJSONContentType(ct string) bool {
	mt, _, _ := strings.Cut(strings.ToLower(ct), ";")
	mt = strings.TrimSpace(mt)
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s, valid UTF-8, as a JSON string.
func appendJSONString[T string | []byte](dst []byte, s T) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

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
