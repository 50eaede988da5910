package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// BatchOptions has the relay publish many events of one topic in one MQTT
// message: fewer bytes on the radio, one PUBACK, one mark. A batch is
// closed at MaxEvents, at MaxBytes, or when MaxDelay has passed; with no
// MaxDelay it holds only what is already pending, so no latency is added
// online and a backlog goes out in full batches. docs/batching.md has the
// wire format and test vectors. The zero value (MaxEvents 0 or 1) is off.
//
// Every guarantee holds per event: commit order within a topic (across
// topics, a batch of one topic may go before an earlier event of another);
// a batch is recorded sent only after its PUBACK; a batch the broker
// refuses, or whose connection is lost, is sent again event by event, so
// only an event at fault is charged; expiry is judged per event at its
// turn, and an event with an Expiry or CorrelationData goes alone, so
// that its MQTT 5 properties stay its own. A crash or power cut duplicates at most
// Window + max(Window, 256) MQTT messages, each of up to MaxEvents events.
type BatchOptions struct {
	// MaxEvents is the most events in one message; 0 or 1 is off.
	MaxEvents int
	// MaxBytes is the most bytes of a batch before compression (its
	// events encoded, and the framing): 64 KiB unless set, at most
	// MaxBatchBytesLimit. An event larger than it goes alone.
	MaxBytes int
	// MaxDelay is the longest a batch waits for more events of its topic
	// after its first is pending; 0 (the default) never waits.
	MaxDelay time.Duration
}

// MaxBatchBytesLimit bounds BatchOptions.MaxBytes, and what a Subscriber
// decompresses a message to: the relay compresses no payload larger.
const MaxBatchBytesLimit = 16 << 20

// maxBatchDelay bounds BatchOptions.MaxDelay.
const maxBatchDelay = time.Minute

// Compressor compresses what the relay publishes (RelayOptions.Compress).
// Package compression has the two that consumers read, compression.Zstd()
// and compression.Gzip(); the relay refuses any other content encoding,
// since over MQTT 3.1.1 a consumer tells a compressed payload by its magic
// bytes.
type Compressor interface {
	// ContentEncoding names the compression on the wire: "zstd" or "gzip".
	ContentEncoding() string
	// AppendCompressed appends src compressed to dst. It must be safe for
	// concurrent use.
	AppendCompressed(dst, src []byte) []byte
}

// compressMinBytes is the least payload worth compressing: below it the
// frame's header costs more than it saves.
const compressMinBytes = 256

// The wire's names (docs/batching.md).
const (
	// batchContentType is a structured batch's MQTT 5 Content Type: a JSON
	// array of CloudEvents structured-mode documents.
	batchContentType = "application/cloudevents-batch+json"
	// rawBatchContentType is a raw batch's: each payload after its length
	// as an unsigned LEB128 varint. MQTT 5 only: 3.1.1 cannot mark it.
	rawBatchContentType = "application/vnd.edgeoutbox.raw-batch"
	// contentEncodingKey is the MQTT 5 user property that names a
	// compressed payload's encoding, "gzip" or "zstd". Over 3.1.1 the
	// payload's magic bytes say it, as no JSON document can begin so.
	contentEncodingKey = "content-encoding"
)

func (o BatchOptions) on() bool { return o.MaxEvents > 1 }

// check validates o and fills in MaxBytes.
func (o BatchOptions) check() (BatchOptions, error) {
	if o.MaxEvents < 0 || o.MaxBytes < 0 || o.MaxDelay < 0 {
		return o, fmt.Errorf("outbox: relay: batch limits must not be negative")
	}
	if !o.on() {
		return BatchOptions{}, nil
	}
	if o.MaxEvents > maxBatchEvents {
		return o, fmt.Errorf("outbox: relay: Batch.MaxEvents %d over %d", o.MaxEvents, maxBatchEvents)
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = 64 << 10
	}
	if o.MaxBytes > MaxBatchBytesLimit {
		return o, fmt.Errorf("outbox: relay: Batch.MaxBytes %d over MaxBatchBytesLimit (%d)", o.MaxBytes, MaxBatchBytesLimit)
	}
	if o.MaxDelay > maxBatchDelay {
		return o, fmt.Errorf("outbox: relay: Batch.MaxDelay %s over %s", o.MaxDelay, maxBatchDelay)
	}
	return o, nil
}

// propertyless is a Publisher that will never carry MQTT 5 properties
// (an MQTTPublisher, or a type embedding one, set to Protocol311).
type propertyless interface{ onlyMQTT311() bool }

// unmarkedPayloads refuses raw payloads batched or compressed on a
// Publisher that carries no properties: a raw batch, or a compressed raw
// payload, is told from one event's bytes only by its Content Type or
// content-encoding, and a raw payload may begin with any bytes, even a
// compression frame's magic.
func unmarkedPayloads(pub Publisher, o RelayOptions) error {
	p, ok := pub.(propertyless)
	if !ok || !p.onlyMQTT311() || o.Envelope != EnvelopeRaw || (!o.Batch.on() && o.Compress == nil) {
		return nil
	}
	return errors.New("outbox: relay: EnvelopeRaw with Batch or Compress needs MQTT 5: over 3.1.1 (Protocol311) nothing marks a raw batch " +
		"or a compressed raw payload; use Protocol5 or ProtocolAuto, or EnvelopeCloudEvents")
}

// parcel is what one publish carries: one row, or a batch of rows of one
// topic, encoded and perhaps compressed.
type parcel struct {
	rows    []*row // in seq order
	one     [1]*row
	topic   string
	payload []byte
	props   PublishProperties
	size    int // a batch's bytes before compression
}

func (p *parcel) first() *row { return p.rows[0] }

// parcelRules is how a session packs rows into parcels.
type parcelRules struct {
	batch   bool  // batches may be built on this connection
	carries bool  // the connection carries MQTT 5 properties
	singly  int64 // rows up to this seq go alone: they were in a batch that failed
	probe   bool  // the first row goes alone
}

// pack packs rows (one read, in seq order) into parcels in the order they
// are published: by their first row's seq. A batch holds rows of one topic
// in seq order; a row that goes alone closes its topic's batch, so that a
// later row of that topic never overtakes it.
func (r *Relay) pack(rows []row, rules parcelRules) []parcel {
	out := make([]parcel, 0, len(rows))
	var open map[string]int
	if rules.batch {
		open = make(map[string]int, 4)
	}
	for i := range rows {
		m := &rows[i]
		alone := !rules.batch || m.encErr != nil || m.expires.Valid || m.correlation != nil || m.seq <= rules.singly || (rules.probe && i == 0) ||
			r.member(m) == nil
		if !alone {
			if j, ok := open[m.topic]; ok {
				if size, fits := r.fits(&out[j], m, rules); fits {
					out[j].rows = append(out[j].rows, m) // copied out of one: its capacity is 1
					out[j].size = size
					continue
				}
			}
		}
		if open != nil {
			delete(open, m.topic)
		}
		// out never grows past its capacity, one parcel a row at most:
		// a parcel's first row may live in the parcel itself.
		out = append(out, parcel{topic: m.topic})
		q := &out[len(out)-1]
		q.one[0] = m
		q.rows = q.one[:1:1]
		if !alone {
			q.size = r.frameBytes() + r.memberBytes(m)
			open[m.topic] = len(out) - 1
		}
	}
	return out
}

// memberBytes is what m adds to a batch: its encoding as a member, and
// its separator or length.
func (r *Relay) memberBytes(m *row) int {
	doc := r.member(m)
	if r.opts.Envelope == EnvelopeRaw {
		return len(doc) + uvarintLen(len(doc))
	}
	return len(doc) + 1
}

// member is m's encoding as a member of a batch: as fetch encoded it, but
// for binary mode, whose encoding is the data alone and whose attributes
// are properties: as a member it is a structured document (kept in m.doc).
func (r *Relay) member(m *row) []byte {
	if r.opts.Envelope != EnvelopeCloudEventsBinary || m.props.User == nil {
		return m.encoded
	}
	if m.doc == nil {
		o := m.outgoing
		o.payload = m.encoded
		// Nil if it cannot (it encoded in binary mode, whose checks are
		// stricter, so it can): then it goes alone.
		m.doc, _ = r.enc.encode(make([]byte, 0, len(m.encoded)*4/3+256+len(m.id)), &o)
	}
	return m.doc
}

// frameBytes is what a batch adds beside its members' bytes: a
// structured batch's "[" (memberBytes counts one byte a member, the ","
// between them and the closing "]").
func (r *Relay) frameBytes() int {
	if r.opts.Envelope == EnvelopeRaw {
		return 0
	}
	return 1
}

func uvarintLen(n int) int {
	l := 1
	for n >= 0x80 {
		n >>= 7
		l++
	}
	return l
}

// fits reports whether m may join the batch p, and p's size with it.
func (r *Relay) fits(p *parcel, m *row, rules parcelRules) (size int, ok bool) {
	b := r.opts.Batch
	size = p.size + r.memberBytes(m)
	if len(p.rows) >= b.MaxEvents || size > b.MaxBytes {
		return size, false
	}
	if r.enc.sizes != nil {
		props := &PublishProperties{ContentType: batchContentType}
		if !rules.carries {
			props = nil
		}
		if r.enc.sizes.CheckSize(p.topic, size, props) != nil {
			return size, false
		}
	}
	return size, true
}

// seal encodes p: a single row as fetch encoded it, a batch in the wire
// format of docs/batching.md; then compresses it where that is asked for,
// allowed on this connection and makes it smaller. Dispatch seals each
// parcel at its turn, not when its read is packed: the first message of a
// read goes out after one compression, not after all of them (a relay on
// a slow CPU, restarted often, got nothing out between restarts).
func (r *Relay) seal(p *parcel, rules parcelRules) {
	if len(p.rows) == 1 {
		m := p.rows[0]
		if m.encErr != nil {
			return
		}
		p.payload, p.props = m.encoded, m.props
	} else if r.opts.Envelope == EnvelopeRaw {
		buf := make([]byte, 0, p.size)
		for _, m := range p.rows {
			buf = binary.AppendUvarint(buf, uint64(len(m.encoded)))
			buf = append(buf, m.encoded...)
		}
		p.payload, p.props = buf, PublishProperties{ContentType: rawBatchContentType}
	} else {
		buf := make([]byte, 0, p.size)
		buf = append(buf, '[')
		for i, m := range p.rows {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, r.member(m)...)
		}
		p.payload = append(buf, ']')
		p.props = PublishProperties{}
		if rules.carries {
			p.props.ContentType = batchContentType
		}
	}
	if r.comp == nil || len(p.payload) < compressMinBytes || len(p.payload) > MaxBatchBytesLimit ||
		(!rules.carries && r.opts.Envelope == EnvelopeRaw) {
		return
	}
	z := r.comp.AppendCompressed(make([]byte, 0, len(p.payload)/2), p.payload)
	if len(z)+len(contentEncodingKey)+8 >= len(p.payload) {
		// Not smaller by what the property saying so costs: the
		// publisher's size limit was checked without it.
		return
	}
	p.payload = z
	if rules.carries {
		user := make([]UserProperty, 0, len(p.props.User)+1)
		p.props.User = append(append(user, p.props.User...), UserProperty{contentEncodingKey, r.comp.ContentEncoding()})
	}
}
