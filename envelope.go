package outbox

import (
	"encoding/base64"
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
	// EnvelopeCloudEventsBinary publishes CloudEvents binary content mode,
	// which the CloudEvents MQTT binding allows for MQTT 5 only: the payload
	// is the event data untouched, its content type is MQTT 5's Content
	// Type, and every other attribute (specversion, id, source, type, time
	// and the sequence extension) is a user property named by the
	// attribute. On a connection that cannot carry properties (MQTT 3.1.1,
	// or a Publisher that is not a PropertiesPublisher) the relay publishes
	// structured mode instead, and logs that once per fallback.
	// DecodeEventMQTT reads both.
	EnvelopeCloudEventsBinary
)

// String returns "cloudevents", "raw" or "binary".
func (e Envelope) String() string {
	switch e {
	case EnvelopeRaw:
		return "raw"
	case EnvelopeCloudEventsBinary:
		return "binary"
	}
	return "cloudevents"
}

// ParseEnvelope parses "cloudevents", "raw" or "binary" (CloudEvents
// binary mode).
func ParseEnvelope(s string) (Envelope, error) {
	switch strings.ToLower(s) {
	case "cloudevents", "ce", "structured", "":
		return EnvelopeCloudEvents, nil
	case "raw":
		return EnvelopeRaw, nil
	case "binary", "cloudevents-binary", "ce-binary":
		return EnvelopeCloudEventsBinary, nil
	}
	return 0, fmt.Errorf("outbox: unknown envelope %q (want cloudevents, binary or raw)", s)
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
	// CorrelationData is the "correlationdata" extension, decoded from
	// base64: MQTT 5's Correlation Data of an answer (Message.CorrelationData),
	// carried in the envelope for MQTT 3.1.1. Nil when absent.
	CorrelationData []byte
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
	correlation []byte // Message.CorrelationData; nil: none
}

// encoder builds the bytes to publish.
type encoder struct {
	prefix      string // topics must start with it
	mode        Envelope
	source      string
	defaultType string
	sizes       SizeLimiter  // the Publisher's, if it has one
	topics      TopicChecker // the Publisher's, if it has one
}

// sequenceDigits zero-pads the sequence extension: the CloudEvents
// sequence extension is a string compared lexicographically.
const sequenceDigits = 20

// encode builds the bytes to publish in structured mode (binary mode too:
// encodeRow chooses binary mode where the connection carries properties) or
// raw.
func (e *encoder) encode(dst []byte, m *outgoing) ([]byte, error) {
	if err := e.checkTopic(m); err != nil {
		return nil, err
	}
	if e.mode == EnvelopeRaw {
		return append(dst, m.payload...), nil
	}
	typ, err := e.attributes(m)
	if err != nil {
		return nil, err
	}
	ct, inline, str := contentTypeOf(m)
	dst = append(dst, `{"specversion":"1.0","id":`...)
	dst = appendJSONString(dst, m.id)
	dst = append(dst, `,"source":`...)
	dst = appendJSONString(dst, e.source)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, typ)
	dst = append(dst, `,"time":"`...)
	dst = time.UnixMilli(m.createdAt).UTC().AppendFormat(dst, timeLayout)
	dst = append(dst, `","datacontenttype":`...)
	dst = appendJSONString(dst, ct)
	dst = append(dst, `,"sequence":"`...)
	dst = appendSequence(dst, m.seq)
	dst = append(dst, '"')
	if len(m.correlation) > 0 {
		dst = append(dst, `,"correlationdata":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, m.correlation)
		dst = append(dst, '"')
	}
	switch {
	case inline:
		dst = append(dst, `,"data":`...)
		dst = append(dst, m.payload...)
	case str && jsonStringLen(m.payload) <= base64.StdEncoding.EncodedLen(len(m.payload))+escapeSlack:
		// Text that escaping would make much longer than base64 (control
		// characters, six bytes each) goes as data_base64, the same data:
		// so no payload grows by more than base64's third and a little
		// (maxEncodedBytes).
		dst = append(dst, `,"data":`...)
		dst = appendJSONString(dst, m.payload)
	default:
		dst = append(dst, `,"data_base64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, m.payload)
		dst = append(dst, '"')
	}
	return append(dst, '}'), nil
}

// checkTopic refuses a topic no envelope can publish.
func (e *encoder) checkTopic(m *outgoing) error {
	if err := ValidateTopic(m.topic); err != nil {
		return undeliverable(err)
	}
	if !strings.HasPrefix(m.topic, e.prefix) {
		return undeliverable(fmt.Errorf("%w: %q is not under %q", ErrTopicOutsidePrefix, m.topic, e.prefix))
	}
	if e.topics != nil {
		if err := e.topics.CheckTopic(m.topic); err != nil {
			return undeliverable(fmt.Errorf("%w: %w", ErrInvalidTopic, err))
		}
	}
	return nil
}

// attributes checks the attributes that come from the row and returns the
// event's type.
func (e *encoder) attributes(m *outgoing) (typ string, err error) {
	typ = m.typ
	if typ == "" {
		typ = e.defaultType
	}
	for _, s := range []string{m.id, typ, m.contentType} {
		if !utf8.ValidString(s) {
			return "", undeliverable(errors.New("id, type or content type is not valid UTF-8"))
		}
	}
	if m.id == "" {
		return "", undeliverable(errors.New("empty id"))
	}

	// Enqueue's bounds, for rows written by plain SQL: they bound the
	// envelope (maxEncodedBytes), and an inbox takes no longer id.
	if len(m.id) > MaxIDBytes || len(typ) > maxTypeBytes || len(m.contentType) > maxTypeBytes {
		return "", undeliverable(fmt.Errorf("id longer than %d bytes, or type or content type longer than %d", MaxIDBytes, maxTypeBytes))
	}
	return typ, nil
}

// maxEnvelopeBytes bounds what structured mode adds to the data's base64:
// the fixed JSON (under 256 bytes), the id, source, type and content type,
// each escaped to at most six bytes a byte, the correlation data's base64
// and its name, and escapeSlack.
const maxEnvelopeBytes = 256 + 6*(MaxIDBytes+3*maxTypeBytes) + (maxBinaryBytes+2)/3*4 + 32 + escapeSlack

// escapeSlack is how much longer than its base64 a text payload may grow
// by escaping and still go as text: a short message with a few quotes
// stays readable.
const escapeSlack = 1024

// maxEncodedBytes bounds the encoding of a payload of n bytes in any
// envelope: structured mode's data_base64 is the longest (inline JSON is
// the payload as it is, and text that escaping would make longer goes as
// base64 too), binary and raw modes carry the payload untouched.
func maxEncodedBytes(n int) int { return base64.StdEncoding.EncodedLen(n) + maxEnvelopeBytes }

// jsonStringLen is the length of appendJSONString(nil, s).
func jsonStringLen(s []byte) int {
	n := len(s) + 2
	for _, c := range s {
		switch {
		case c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&':
		case c == '"', c == '\\', c == '\n', c == '\r', c == '\t':
			n++
		default:
			n += 5
		}
	}
	return n
}

// contentTypeOf is the event's datacontenttype: the row's, or for a row
// without one what its payload is; inline says the payload goes in
// structured mode's data as JSON, str as a JSON string.
func contentTypeOf(m *outgoing) (ct string, inline, str bool) {
	ct = m.contentType
	switch {
	case ct == "":
		switch {
		case validJSON(m.payload):
			ct, inline = "application/json", true
		case m.text && utf8.Valid(m.payload):
			// A writer that stored text meant text; a BLOB stays bytes
			// even when they happen to be text.
			ct, str = "text/plain; charset=utf-8", true
		default:
			ct = "application/octet-stream"
		}
	case isJSONContentType(ct):
		inline = validJSON(m.payload)
	}
	return ct, inline, str
}

// appendSequence appends the sequence extension, zero-padded.
func appendSequence(dst []byte, seq int64) []byte {
	var b [20]byte
	digits := strconv.AppendInt(b[:0], seq, 10)
	for i := len(digits); i < sequenceDigits; i++ {
		dst = append(dst, '0')
	}
	return append(dst, digits...)
}

// timeLayout is the CloudEvents time attribute as the relay writes it: the
// commit's wall-clock time in milliseconds, UTC.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// encodeBinary builds CloudEvents binary mode for MQTT 5: the payload
// untouched, the datacontenttype as props' ContentType and every other
// attribute as a user property. It sets only those two fields of props.
func (e *encoder) encodeBinary(dst []byte, m *outgoing, props *PublishProperties) ([]byte, error) {
	if err := e.checkTopic(m); err != nil {
		return nil, err
	}
	typ, err := e.attributes(m)
	if err != nil {
		return nil, err
	}
	// MQTT 5 forbids U+0000 in a string property [MQTT-1.5.4-2]: a broker
	// would close the connection on it, over and over.
	for _, s := range []string{m.id, typ, m.contentType, e.source} {
		if strings.IndexByte(s, 0) >= 0 {
			return nil, undeliverable(errors.New("binary mode: id, source, type or content type holds U+0000, which an MQTT 5 property cannot"))
		}
	}
	ct, _, _ := contentTypeOf(m)
	props.ContentType = ct
	props.User = []UserProperty{
		{"specversion", "1.0"},
		{"id", m.id},
		{"source", e.source},
		{"type", typ},
		{"time", time.UnixMilli(m.createdAt).UTC().Format(timeLayout)},
		{"sequence", string(appendSequence(make([]byte, 0, sequenceDigits), m.seq))},
	}
	if len(m.correlation) > 0 {
		props.User = append(props.User, UserProperty{"correlationdata", base64.StdEncoding.EncodeToString(m.correlation)})
	}
	return append(dst, m.payload...), nil
}

// encodeRow encodes m for a session whose connection carries properties
// (carries) or not: binary mode where it can, structured mode where binary
// mode was asked for and it cannot. A message larger than the Publisher
// allows, as it will be sent, cannot be published.
func (e *encoder) encodeRow(m *row, carries bool) {
	if len(m.correlation) > maxBinaryBytes {
		// A plain-SQL writer's: MQTT's binary data has two length bytes.
		m.encErr = undeliverable(fmt.Errorf("%w: correlation data of %d bytes, over MQTT's %d", ErrInvalidMessage, len(m.correlation), maxBinaryBytes))
		return
	}
	if e.mode == EnvelopeCloudEventsBinary && carries {
		m.encoded, m.encErr = e.encodeBinary(make([]byte, 0, len(m.payload)), &m.outgoing, &m.props)
	} else {
		m.encoded, m.encErr = e.encode(make([]byte, 0, len(m.payload)*4/3+256+len(m.id)), &m.outgoing)
		if carries && e.mode == EnvelopeCloudEvents {
			// The CloudEvents MQTT binding: in structured mode over MQTT 5
			// the Content Type is the event format's media type.
			m.props.ContentType = structuredContentType
		}
	}
	if carries && len(m.correlation) > 0 && m.encErr == nil {
		// Every mode, raw too: MQTT 5's own property, which a requester
		// matches its answer by.
		m.props.CorrelationData = m.correlation
	}
	if m.encErr == nil && e.sizes != nil {
		props := &m.props
		if !carries {
			props = nil
		}
		if err := e.sizes.CheckSize(m.topic, len(m.encoded), props); err != nil {
			m.encErr = undeliverable(err)
		}
	}
}

// structuredContentType is the media type of a CloudEvents structured-mode
// JSON document.
const structuredContentType = "application/cloudevents+json"

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
