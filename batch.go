package outbox

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/edgeoutbox/outbox/internal/compress"
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
// turn, and an event with an Expiry goes alone, so that the broker's
// Message Expiry stays its own. A crash or power cut duplicates at most
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

// Compression selects how the relay compresses what it publishes.
type Compression int

const (
	// CompressNone publishes payloads as they are (the default).
	CompressNone Compression = iota
	// CompressGzip compresses with gzip (RFC 1952).
	CompressGzip
	// CompressZstd compresses with Zstandard (RFC 8878).
	CompressZstd
)

// compressMinBytes is the least payload worth compressing: below it the
// frame's header costs more than it saves.
const compressMinBytes = 256

// String returns "none", "gzip" or "zstd".
func (c Compression) String() string {
	switch c {
	case CompressGzip:
		return "gzip"
	case CompressZstd:
		return "zstd"
	}
	return "none"
}

// ParseCompression parses "none", "gzip" or "zstd".
func ParseCompression(s string) (Compression, error) {
	switch strings.ToLower(s) {
	case "none", "":
		return CompressNone, nil
	case "gzip":
		return CompressGzip, nil
	case "zstd":
		return CompressZstd, nil
	}
	return 0, fmt.Errorf("outbox: unknown compression %q (want none, gzip or zstd)", s)
}

func (c Compression) alg() compress.Alg {
	switch c {
	case CompressGzip:
		return compress.Gzip
	case CompressZstd:
		return compress.Zstd
	}
	return compress.None
}

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
	if o.MaxEvents > 65535 {
		return o, fmt.Errorf("outbox: relay: Batch.MaxEvents %d over 65,535", o.MaxEvents)
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
	if !ok || !p.onlyMQTT311() || o.Envelope != EnvelopeRaw || (!o.Batch.on() && o.Compress == CompressNone) {
		return nil
	}
	return errors.New("outbox: relay: EnvelopeRaw with Batch or Compress needs MQTT 5: over 3.1.1 (Protocol311) nothing marks a raw batch " +
		"or a compressed raw payload; use Protocol5 or ProtocolAuto, or EnvelopeCloudEvents")
}
