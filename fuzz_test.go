package outbox

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzValidateTopic(f *testing.F) {
	for _, s := range []string{"", "a", "stores/42/orders", "a/+/b", "#", "a\x00", "\xff", "$SYS/x", "/", "ü/ß", strings.Repeat("a", 65536)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		err := ValidateTopic(topic)
		valid := topic != "" && len(topic) <= 65535 && utf8.ValidString(topic) &&
			!strings.ContainsAny(topic, "+#\x00")
		if valid != (err == nil) {
			t.Fatalf("ValidateTopic(%q) = %v, want valid=%v", topic, err, valid)
		}
	})
}

// FuzzEnvelope checks that whatever is enqueued comes out of the envelope
// as the same data, and that the document is valid JSON.
func FuzzEnvelope(f *testing.F) {
	f.Add(int64(1), "id-1", "t", []byte(`{"a":1}`), "", "")
	f.Add(int64(99), "x", "t/u", []byte{0, 1, 2, 0xff}, "com.example", "application/octet-stream")
	f.Add(int64(12345678901), "\"q\"<>&", "t", []byte(`"str"`), "ty\npe", "application/cloudevents+json")
	f.Add(int64(7), "id", "t", []byte(` [1, 2] `), "", "text/plain")
	f.Add(int64(7), "id", "t", []byte{}, "", "")
	f.Fuzz(func(t *testing.T, seq int64, id, topic string, payload []byte, typ, ct string) {
		if seq < 0 {
			seq = -seq
		}
		if seq < 0 { // math.MinInt64
			seq = 0
		}
		enc := encoder{source: "/dev/\"1\"", defaultType: DefaultEventType}
		m := &outgoing{seq: seq, id: id, topic: topic, payload: payload, typ: typ, contentType: ct, createdAt: 1_700_000_000_123}
		out, err := enc.encode(nil, m)
		if err != nil {
			if ValidateTopic(topic) == nil && id != "" && utf8.ValidString(id) && utf8.ValidString(typ) && utf8.ValidString(ct) {
				t.Fatalf("encode refused a valid message: %v", err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("not JSON: %s", out)
		}
		ev, err := DecodeEvent(out)
		if err != nil {
			t.Fatalf("decode: %v\n%s", err, out)
		}
		if ev.ID != id || ev.Sequence != seq || ev.Source != enc.source {
			t.Fatalf("round trip: got %+v", ev)
		}
		wantType := typ
		if wantType == "" {
			wantType = DefaultEventType
		}
		if ev.Type != wantType {
			t.Fatalf("type %q, want %q", ev.Type, wantType)
		}
		if bytes.Contains(out, []byte(`"data_base64"`)) {
			if !bytes.Equal(ev.Data, payload) {
				t.Fatalf("data %q, want %q", ev.Data, payload)
			}
		} else if !bytes.Equal(ev.Data, bytes.TrimSpace(payload)) {
			t.Fatalf("inline data %q, want %q", ev.Data, payload)
		}
	})
}

func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(`{"specversion":"1.0","id":"1","source":"s","type":"t","data":{"x":1}}`))
	f.Add([]byte(`{"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"AAE=","sequence":"0042","time":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"specversion":"0.3"}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := DecodeEvent(b)
		if err == nil && (ev.ID == "" || ev.Source == "" || ev.Type == "") {
			t.Fatalf("accepted an event without id, source or type: %s", b)
		}
	})
}
