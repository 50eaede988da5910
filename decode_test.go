package outbox

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/edgeoutbox/outbox/compression"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/compress"
)

var updateVectors = flag.Bool("update-vectors", false, "write testdata/batching/ anew from batchingVectors")

// batchVector is one file of testdata/batching/: bytes in, events (or
// payloads) out, or a refusal. docs/batching.md describes the fields.
type batchVector struct {
	Description    string        `json:"description"`
	MQTT           string        `json:"mqtt"`     // "5" or "3.1.1"
	Envelope       string        `json:"envelope"` // "cloudevents" or "raw"
	ContentType    string        `json:"content_type,omitempty"`
	UserProperties [][2]string   `json:"user_properties,omitempty"`
	PayloadBase64  string        `json:"payload_base64"`
	Events         []vectorEvent `json:"events,omitempty"`
	Payloads       []vectorData  `json:"payloads,omitempty"`
	Rejected       string        `json:"rejected,omitempty"`
}

type vectorEvent struct {
	ID              string `json:"id"`
	Source          string `json:"source"`
	Type            string `json:"type"`
	Time            string `json:"time"`
	DataContentType string `json:"datacontenttype"`
	Sequence        int64  `json:"sequence"`
	vectorData
}

// vectorData is bytes as text where they are UTF-8, else as base64.
type vectorData struct {
	Data       *string `json:"data,omitempty"`
	DataBase64 *string `json:"data_base64,omitempty"`
}

func dataOf(b []byte) vectorData {
	s := string(b)
	if utf8.Valid(b) {
		return vectorData{Data: &s}
	}
	s = base64.StdEncoding.EncodeToString(b)
	return vectorData{DataBase64: &s}
}

func (d vectorData) bytes(t testing.TB) []byte {
	if d.Data != nil {
		return []byte(*d.Data)
	}
	if d.DataBase64 == nil {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(*d.DataBase64)
	require.NoError(t, err)
	return b
}

func (v *batchVector) user() []UserProperty {
	var u []UserProperty
	for _, p := range v.UserProperties {
		u = append(u, UserProperty{p[0], p[1]})
	}
	return u
}

// vectorRows are the events of the vectors: order events of a till, as the
// pos example's, each as the relay encodes it.
func vectorRows() []*outgoing {
	created := time.Date(2026, 11, 30, 10, 15, 2, 123e6, time.UTC).UnixMilli()
	var rows []*outgoing
	for i, order := range []string{
		`{"order":"42-7-0017","store":42,"till":7,"cashier":"c-311","lines":[{"sku":"4006381333931","qty":2,"price":"1.29"}],"total":"2.58"}`,
		`{"order":"42-7-0018","store":42,"till":7,"cashier":"c-311","lines":[{"sku":"5000112637922","qty":1,"price":"0.99"},{"sku":"8710398520014","qty":3,"price":"2.49"}],"total":"8.46"}`,
		`{"order":"42-7-0019","store":42,"till":7,"cashier":"c-204","lines":[{"sku":"4006381333931","qty":1,"price":"1.29"},{"sku":"7622210449283","qty":2,"price":"1.79"},{"sku":"5449000000996","qty":6,"price":"0.89"}],"total":"10.21"}`,
		`{"order":"42-7-0020","store":42,"till":7,"cashier":"c-204","lines":[{"sku":"4006381333931","qty":3,"price":"1.29"},{"sku":"7622210449283","qty":1,"price":"1.79"},{"sku":"5449000000996","qty":2,"price":"0.89"},{"sku":"8710398520014","qty":1,"price":"2.49"}],"total":"9.83"}`,
	} {
		rows = append(rows, &outgoing{seq: int64(17 + i), id: fmt.Sprintf("019ad2f4-5c1e-7a3b-9f00-3c5e8d1b2a%02d", 47+i),
			topic: "stores/42/orders", payload: []byte(order), typ: "com.example.order.created", createdAt: created + int64(i)*1000})
	}
	return rows
}

const vectorSource = "/stores/42/tills/7"

func vectorEncoder() *encoder { return &encoder{source: vectorSource, defaultType: DefaultEventType} }

// structuredBatch is the relay's structured batch of rows: each event as
// the relay encodes a single one, joined by "," inside "[" "]".
func structuredBatch(t testing.TB, rows []*outgoing) []byte {
	b := []byte{'['}
	for i, m := range rows {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		b, err = vectorEncoder().encode(b, m)
		require.NoError(t, err)
	}
	return append(b, ']')
}

func compressed(t testing.TB, alg compress.Alg, p []byte) []byte {
	c, err := compress.NewCompressor(alg)
	require.NoError(t, err)
	defer c.Close()
	return c.Append(nil, p)
}

// zeros is a compression bomb: n zero bytes, compressed as a stream so that
// the test never holds them.
func zeros(t testing.TB, alg compress.Alg, n int) []byte {
	var buf bytes.Buffer
	chunk := make([]byte, 1<<20)
	if alg == compress.Zstd {
		w, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
		require.NoError(t, err)
		for ; n > 0; n -= len(chunk) {
			w.Write(chunk[:min(n, len(chunk))])
		}
		require.NoError(t, w.Close())
		return buf.Bytes()
	}
	c, err := compress.NewCompressor(alg)
	require.NoError(t, err)
	defer c.Close()
	return c.Append(nil, make([]byte, n))
}

func eventsOf(rows []*outgoing) []vectorEvent {
	var evs []vectorEvent
	for _, m := range rows {
		ct, _, _ := contentTypeOf(m)
		evs = append(evs, vectorEvent{ID: m.id, Source: vectorSource, Type: m.typ,
			Time: time.UnixMilli(m.createdAt).UTC().Format(timeLayout), DataContentType: ct, Sequence: m.seq, vectorData: dataOf(m.payload)})
	}
	return evs
}

func rawBatch(payloads ...[]byte) []byte {
	var b []byte
	for _, p := range payloads {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}

// batchingVectors builds the vectors from the relay's own single-event
// encoder, so they say what the relay writes.
func batchingVectors(t testing.TB) map[string]batchVector {
	rows := vectorRows()
	three := rows[:3] // a batch's
	batch := structuredBatch(t, three)
	b64 := base64.StdEncoding.EncodeToString
	// A bomb takes a while to build, and its bytes are only written: the
	// tests read the file's.
	bomb := func(build func() []byte) string {
		if !*updateVectors {
			return ""
		}
		return b64(build())
	}
	ce := [2]string{contentEncodingKey, ""}
	with := func(alg compress.Alg) [][2]string { ce[1] = alg.String(); return [][2]string{ce} }
	var binProps PublishProperties
	binData, err := vectorEncoder().encodeBinary(nil, rows[3], &binProps) // 256 bytes or more: worth compressing
	require.NoError(t, err)
	var binUser [][2]string
	for _, u := range binProps.User {
		binUser = append(binUser, [2]string{u.Key, u.Value})
	}
	single, err := vectorEncoder().encode(nil, rows[2])
	require.NoError(t, err)
	ownGzip := compressed(t, compress.Gzip, []byte("the application's own gzip"))

	v := map[string]batchVector{
		"single-structured-mqtt5": {Description: "one event, structured mode, as before batching",
			MQTT: "5", Envelope: "cloudevents", ContentType: structuredContentType, PayloadBase64: b64(single), Events: eventsOf(rows[2:3])},
		"single-structured-zstd-mqtt311": {Description: "one event of 256 bytes or more, structured mode, zstd; over 3.1.1 its magic bytes say so",
			MQTT: "3.1.1", Envelope: "cloudevents", PayloadBase64: b64(compressed(t, compress.Zstd, single)), Events: eventsOf(rows[2:3])},
		"single-binary-gzip-mqtt5": {Description: "one event in binary mode whose data is gzip-compressed: the content-encoding property says so, the content type stays the data's",
			MQTT: "5", Envelope: "cloudevents", ContentType: binProps.ContentType, UserProperties: append(binUser, with(compress.Gzip)...),
			PayloadBase64: b64(compressed(t, compress.Gzip, binData)), Events: eventsOf(rows[3:])},
		"single-binary-own-gzip-mqtt5": {Description: "binary mode whose data is the application's own gzip, without content-encoding: never sniffed, the data is those bytes",
			MQTT: "5", Envelope: "cloudevents", ContentType: "application/gzip", UserProperties: binUser, PayloadBase64: b64(ownGzip),
			Events: func() []vectorEvent {
				e := eventsOf([]*outgoing{rows[3]})
				e[0].DataContentType, e[0].vectorData = "application/gzip", dataOf(ownGzip)
				return e
			}()},
		"batch-structured-mqtt5": {Description: "a structured batch of three events over MQTT 5: its content type says so",
			MQTT: "5", Envelope: "cloudevents", ContentType: batchContentType, PayloadBase64: b64(batch), Events: eventsOf(three)},
		"batch-structured-mqtt311": {Description: "a structured batch over MQTT 3.1.1: its first byte '[' says so",
			MQTT: "3.1.1", Envelope: "cloudevents", PayloadBase64: b64(batch), Events: eventsOf(three)},
		"batch-zstd-mqtt5": {Description: "a structured batch, zstd; the content type stays the batch's",
			MQTT: "5", Envelope: "cloudevents", ContentType: batchContentType, UserProperties: with(compress.Zstd),
			PayloadBase64: b64(compressed(t, compress.Zstd, batch)), Events: eventsOf(three)},
		"batch-gzip-mqtt5": {Description: "a structured batch, gzip",
			MQTT: "5", Envelope: "cloudevents", ContentType: batchContentType, UserProperties: with(compress.Gzip),
			PayloadBase64: b64(compressed(t, compress.Gzip, batch)), Events: eventsOf(three)},
		"batch-zstd-mqtt311": {Description: "a structured batch, zstd, over MQTT 3.1.1: the magic bytes 28 B5 2F FD say so, then '['",
			MQTT: "3.1.1", Envelope: "cloudevents", PayloadBase64: b64(compressed(t, compress.Zstd, batch)), Events: eventsOf(three)},
		"batch-gzip-mqtt311": {Description: "a structured batch, gzip, over MQTT 3.1.1: the magic bytes 1F 8B say so",
			MQTT: "3.1.1", Envelope: "cloudevents", PayloadBase64: b64(compressed(t, compress.Gzip, batch)), Events: eventsOf(three)},
		"raw-batch-mqtt5": {Description: "a raw batch: each payload after its length as an unsigned LEB128 varint",
			MQTT: "5", Envelope: "raw", ContentType: rawBatchContentType,
			PayloadBase64: b64(rawBatch(rows[0].payload, []byte{}, ownGzip)),
			Payloads:      []vectorData{dataOf(rows[0].payload), dataOf([]byte{}), dataOf(ownGzip)}},
		"raw-batch-zstd-mqtt5": {Description: "a raw batch, zstd",
			MQTT: "5", Envelope: "raw", ContentType: rawBatchContentType, UserProperties: with(compress.Zstd),
			PayloadBase64: b64(compressed(t, compress.Zstd, rawBatch(rows[0].payload, rows[1].payload, rows[2].payload))),
			Payloads:      []vectorData{dataOf(rows[0].payload), dataOf(rows[1].payload), dataOf(rows[2].payload)}},
		"raw-single-own-gzip-mqtt311": {Description: "a single raw payload is the application's bytes, whatever they begin with: never sniffed",
			MQTT: "3.1.1", Envelope: "raw", PayloadBase64: b64(ownGzip), Payloads: []vectorData{dataOf(ownGzip)}},

		"reject-zstd-bomb": {Description: "a zstd frame of 64 MiB of zeros: over the 16 MiB bound, refused without decompressing it all",
			MQTT: "5", Envelope: "cloudevents", ContentType: batchContentType, UserProperties: with(compress.Zstd),
			PayloadBase64: bomb(func() []byte { return zeros(t, compress.Zstd, 64<<20) }), Rejected: "decompresses to more than 16 MiB"},
		"reject-gzip-bomb-mqtt311": {Description: "a gzip member of 16 MiB and one byte of '[': over the bound",
			MQTT: "3.1.1", Envelope: "cloudevents", PayloadBase64: bomb(func() []byte { return compressed(t, compress.Gzip, bytes.Repeat([]byte{'['}, MaxBatchBytesLimit+1)) }),
			Rejected: "decompresses to more than 16 MiB"},
		"reject-truncated-zstd": {Description: "a zstd batch cut short",
			MQTT: "5", Envelope: "cloudevents", ContentType: batchContentType, UserProperties: with(compress.Zstd),
			PayloadBase64: b64(func() []byte { z := compressed(t, compress.Zstd, batch); return z[:len(z)-9] }()), Rejected: "truncated frame"},
		"reject-truncated-raw-batch": {Description: "a raw batch whose last length says more bytes than are left",
			MQTT: "5", Envelope: "raw", ContentType: rawBatchContentType,
			PayloadBase64: b64(func() []byte { r := rawBatch(rows[0].payload, rows[1].payload); return r[:len(r)-1] }()), Rejected: "truncated frame"},
		"reject-bad-json-in-batch": {Description: "a batch whose second event is not JSON: the whole message is refused",
			MQTT: "5", Envelope: "cloudevents", ContentType: batchContentType,
			PayloadBase64: b64(bytes.Replace(batch, []byte(`},{"specversion"`), []byte(`},{specversion"`), 1)), Rejected: "bad JSON"},
		"reject-event-without-id-in-batch": {Description: "a batch whose second event has no id: every event must decode",
			MQTT: "3.1.1", Envelope: "cloudevents",
			PayloadBase64: b64(bytes.Replace(batch, []byte(`"id":"`+rows[1].id+`",`), nil, 1)), Rejected: "an event without id"},
		"reject-empty-batch": {Description: "an empty array", MQTT: "5", Envelope: "cloudevents", ContentType: batchContentType,
			PayloadBase64: b64([]byte(`[]`)), Rejected: "no events"},
		"reject-unknown-encoding": {Description: "a content-encoding other than gzip or zstd", MQTT: "5", Envelope: "cloudevents",
			ContentType: batchContentType, UserProperties: [][2]string{{contentEncodingKey, "br"}}, PayloadBase64: b64(batch), Rejected: "unknown content-encoding"},
	}
	return v
}

const vectorDir = "testdata/batching"

// vectorErrors is what the Go decoder says of each refused vector.
var vectorErrors = map[string]string{
	"reject-zstd-bomb":                 "zstd: decompresses to more than the limit",
	"reject-gzip-bomb-mqtt311":         "gzip: decompresses to more than the limit",
	"reject-truncated-zstd":            "zstd: unexpected EOF",
	"reject-truncated-raw-batch":       "payload 2: 178 bytes, 177 left",
	"reject-bad-json-in-batch":         "event 2: invalid character",
	"reject-event-without-id-in-batch": "id, source and type are required (event 2 of a batch)",
	"reject-empty-batch":               "no events",
	"reject-unknown-encoding":          `unknown content encoding "br"`,
}

// TestBatchingVectors: every vector of testdata/batching/ (docs/batching.md)
// decodes to its events or payloads, or is refused; DecodeEventMQTT reads
// each single event as DecodeEventsMQTT does. The vectors are what
// batchingVectors builds from the relay's encoder, byte for byte.
func TestBatchingVectors(t *testing.T) {
	built := batchingVectors(t)
	if *updateVectors {
		require.NoError(t, os.RemoveAll(vectorDir))
		require.NoError(t, os.MkdirAll(vectorDir, 0o755))
		for name, v := range built {
			b, err := json.MarshalIndent(v, "", "  ")
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(vectorDir, name+".json"), append(b, '\n'), 0o644))
		}
	}
	files, err := filepath.Glob(filepath.Join(vectorDir, "*.json"))
	require.NoError(t, err)
	require.Len(t, files, len(built), "run go test -run TestBatchingVectors -update-vectors")
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		t.Run(name, func(t *testing.T) {
			if strings.Contains(name, "bomb") {
				// Each decompresses 16 MiB: seconds under -race or qemu.
				if testing.Short() {
					t.Skip("decompresses 16 MiB")
				}
				t.Parallel()
			}
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			var v batchVector
			require.NoError(t, json.Unmarshal(b, &v))
			want, ok := built[name]
			require.True(t, ok, "no such vector is built")
			if !strings.Contains(want.Rejected+want.Description, "bomb") && !strings.Contains(name, "zstd") && !strings.Contains(name, "gzip") {
				// Compressors may change their bytes between versions;
				// what the relay encodes itself may not.
				require.Equal(t, want.PayloadBase64, v.PayloadBase64, "the relay's encoding changed")
			}
			payload, err := base64.StdEncoding.DecodeString(v.PayloadBase64)
			require.NoError(t, err)
			if v.MQTT == "3.1.1" {
				require.True(t, v.ContentType == "" && len(v.UserProperties) == 0, "3.1.1 carries no properties")
			}
			if v.Envelope == "raw" {
				got, err := DecodeRawMQTT(payload, v.ContentType, v.user())
				if v.Rejected != "" {
					require.ErrorContains(t, err, vectorErrors[name])
					return
				}
				require.NoError(t, err)
				require.Len(t, got, len(v.Payloads))
				for i, p := range v.Payloads {
					require.Equal(t, p.bytes(t), got[i], "payload %d", i)
				}
				return
			}
			evs, err := DecodeEventsMQTT(payload, v.ContentType, v.user())
			if v.Rejected != "" {
				require.ErrorContains(t, err, vectorErrors[name])
				require.Nil(t, evs)
				return
			}
			require.NoError(t, err)
			require.Len(t, evs, len(v.Events))
			for i, w := range v.Events {
				ev := evs[i]
				require.Equal(t, w.ID, ev.ID)
				require.Equal(t, w.Source, ev.Source)
				require.Equal(t, w.Type, ev.Type)
				require.Equal(t, w.Time, ev.Time.UTC().Format(timeLayout))
				require.Equal(t, w.DataContentType, ev.DataContentType)
				require.Equal(t, w.Sequence, ev.Sequence)
				require.Equal(t, w.bytes(t), ev.Data, "event %d's data", i)
			}
			if len(evs) == 1 && v.MQTT == "5" {
				one, err := DecodeEventMQTT(payload, v.ContentType, v.user())
				require.NoError(t, err)
				require.Equal(t, evs[0], one)
			}
		})
	}
}

// TestDecodeEventsMQTTBombBounded: a zstd frame of 1 GiB of zeros, told
// by its magic bytes, is refused having allocated a few times the bound
// (the decoder's window, the buffer's doublings), not what it holds.
func TestDecodeEventsMQTTBombBounded(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's own allocations would be counted, and it decompresses slowly")
	}
	z := zeros(t, compress.Zstd, 1<<30)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := DecodeEventsMQTT(z, "", nil)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, compress.ErrTooLarge)
	alloc := after.TotalAlloc - before.TotalAlloc
	require.Less(t, alloc, uint64(8*MaxBatchBytesLimit), "%d MiB allocated", alloc>>20)
	t.Logf("a 1 GiB bomb: %d MiB allocated", alloc>>20)
}

// TestDecodeEventMQTTCompressed: DecodeEventMQTT decompresses a single
// event whose content-encoding property says so, and reads the rest as
// before: a magic-bytes payload without the property is not sniffed
// there, and a batch is not its to read.
func TestDecodeEventMQTTCompressed(t *testing.T) {
	rows := vectorRows()
	single, err := vectorEncoder().encode(nil, rows[0])
	require.NoError(t, err)
	z := compressed(t, compress.Zstd, single)
	ev, err := DecodeEventMQTT(z, structuredContentType, []UserProperty{{contentEncodingKey, "zstd"}})
	require.NoError(t, err)
	require.Equal(t, rows[0].id, ev.ID)
	_, err = DecodeEventMQTT(z, "", nil)
	require.Error(t, err, "sniffed")
	_, err = DecodeEventMQTT(structuredBatch(t, rows), batchContentType, nil)
	require.Error(t, err, "a batch")
	_, err = DecodeEventMQTT(z, structuredContentType, []UserProperty{{contentEncodingKey, "zstd"}, {contentEncodingKey, "zstd"}})
	require.ErrorContains(t, err, "given twice")
}

// TestDecodeEventsMQTTLimits: a batch of more events than the most (the
// relay's 65,535, here fewer), a raw batch of more payloads, and a JSON
// array over MaxBatchBytesLimit are refused; a raw batch of the most is
// read.
func TestDecodeEventsMQTTLimits(t *testing.T) {
	batch := structuredBatch(t, vectorRows()[:3])
	_, err := decodeBatch(batch, 2)
	require.ErrorContains(t, err, "more than 2 events")
	parts, err := decodeBatch(batch, 3)
	require.NoError(t, err)
	require.Len(t, parts, 3)

	raw := make([]byte, maxBatchEvents) // empty payloads, one byte each
	got, err := DecodeRawMQTT(raw, rawBatchContentType, nil)
	require.NoError(t, err)
	require.Len(t, got, maxBatchEvents)
	_, err = DecodeRawMQTT(append(raw, 0), rawBatchContentType, nil)
	require.ErrorContains(t, err, "more than 65535 payloads")
	_, err = DecodeRawMQTT([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, rawBatchContentType, nil)
	require.ErrorContains(t, err, "overlong")
	_, err = DecodeRawMQTT(nil, rawBatchContentType, nil)
	require.ErrorContains(t, err, "no payloads")

	big := append(append([]byte{'['}, bytes.Repeat([]byte{' '}, MaxBatchBytesLimit)...), ']')
	_, err = DecodeEventsMQTT(big, batchContentType, nil)
	require.ErrorContains(t, err, "over MaxBatchBytesLimit")
	_, err = DecodeEventsMQTT(structuredBatch(t, vectorRows()), rawBatchContentType, nil)
	require.ErrorContains(t, err, "DecodeRawMQTT")
	_, err = DecodeEventsMQTT(append(structuredBatch(t, vectorRows()), " []"...), batchContentType, nil)
	require.ErrorContains(t, err, "more after the array")
	if errors.Is(err, ErrInvalidMessage) {
		t.Fatal("a message that cannot be decoded is not an event the handler refused")
	}
}

// TestBatchingVectorsAreTheRelays: the relay's own packing (Relay.pack) of
// the vectors' events writes the vectors' payloads and properties, byte for
// byte, over MQTT 5 and 3.1.1, in each envelope and compression the
// vectors show; and DecodeEventsMQTT reads back what it wrote.
func TestBatchingVectorsAreTheRelays(t *testing.T) {
	built := batchingVectors(t)
	for _, tc := range []struct {
		vector string
		env    Envelope
		comp   Compressor
		rows   []int // of vectorRows
	}{
		{"single-structured-mqtt5", EnvelopeCloudEvents, nil, []int{2}},
		{"single-structured-zstd-mqtt311", EnvelopeCloudEvents, compression.Zstd(), []int{2}},
		{"single-binary-gzip-mqtt5", EnvelopeCloudEventsBinary, compression.Gzip(), []int{3}},
		{"batch-structured-mqtt5", EnvelopeCloudEvents, nil, []int{0, 1, 2}},
		{"batch-structured-mqtt311", EnvelopeCloudEvents, nil, []int{0, 1, 2}},
		{"batch-structured-mqtt5", EnvelopeCloudEventsBinary, nil, []int{0, 1, 2}},
		{"batch-zstd-mqtt5", EnvelopeCloudEvents, compression.Zstd(), []int{0, 1, 2}},
		{"batch-gzip-mqtt5", EnvelopeCloudEvents, compression.Gzip(), []int{0, 1, 2}},
		{"batch-zstd-mqtt311", EnvelopeCloudEvents, compression.Zstd(), []int{0, 1, 2}},
		{"batch-gzip-mqtt311", EnvelopeCloudEvents, compression.Gzip(), []int{0, 1, 2}},
		{"raw-batch-zstd-mqtt5", EnvelopeRaw, compression.Zstd(), []int{0, 1, 2}},
	} {
		t.Run(tc.vector+"/"+tc.env.String(), func(t *testing.T) {
			v := built[tc.vector]
			carries := v.MQTT == "5"
			r := &Relay{opts: RelayOptions{Envelope: tc.env, Batch: BatchOptions{MaxEvents: 10, MaxBytes: 64 << 10}},
				enc: encoder{mode: tc.env, source: vectorSource, defaultType: DefaultEventType}}
			if tc.comp != nil {
				r.comp = tc.comp
			}
			all := vectorRows()
			rows := make([]row, len(tc.rows))
			for i, j := range tc.rows {
				rows[i].outgoing = *all[j]
				r.enc.encodeRow(&rows[i], carries)
				require.NoError(t, rows[i].encErr)
			}
			rules := parcelRules{batch: true, carries: carries}
			parcels := r.pack(rows, rules)
			require.Len(t, parcels, 1)
			p := parcels[0]
			r.seal(&p, rules)
			require.Equal(t, v.PayloadBase64, base64.StdEncoding.EncodeToString(p.payload), "the payload")
			var user [][2]string
			for _, u := range p.props.User {
				user = append(user, [2]string{u.Key, u.Value})
			}
			if !carries {
				require.Empty(t, p.props.ContentType)
				require.Empty(t, user)
			} else {
				require.Equal(t, v.ContentType, p.props.ContentType)
				require.Equal(t, v.UserProperties, user)
			}
			evs, err := DecodeEventsMQTT(p.payload, p.props.ContentType, p.props.User)
			if tc.env == EnvelopeRaw {
				got, err := DecodeRawMQTT(p.payload, p.props.ContentType, p.props.User)
				require.NoError(t, err)
				require.Len(t, got, len(tc.rows))
				return
			}
			require.NoError(t, err)
			require.Len(t, evs, len(tc.rows))
		})
	}
}
