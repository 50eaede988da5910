package outbox

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func FuzzValidateTopic(f *testing.F) {
	for _, s := range []string{"", "a", "stores/42/orders", "a/+/b", "#", "a\x00", "\xff", "$SYS/x", "/", "ü/ß", strings.Repeat("a", 65536)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		err := ValidateTopic(topic)
		valid := topic != "" && len(topic) <= 65535 && utf8.ValidString(topic) &&
			!strings.ContainsAny(topic, "+#\x00") && topic[0] != '$' &&
			!strings.ContainsFunc(topic, func(r rune) bool {
				return unicode.IsControl(r) || r >= 0xfdd0 && r <= 0xfdef || r&0xfffe == 0xfffe
			})
		if valid != (err == nil) {
			t.Fatalf("ValidateTopic(%q) = %v, want valid=%v", topic, err, valid)
		}
	})
}

// FuzzEnvelope checks that whatever is enqueued, stored as a BLOB or as
// TEXT, comes out of the envelope as the same data, with the content type
// the relay promises, and that the document is valid JSON.
func FuzzEnvelope(f *testing.F) {
	f.Add(int64(1), "id-1", "t", []byte(`{"a":1}`), "", "")
	f.Add(int64(99), "x", "t/u", []byte{0, 1, 2, 0xff}, "com.example", "application/octet-stream")
	f.Add(int64(12345678901), "\"q\"<>&", "t", []byte(`"str"`), "ty\npe", "application/cloudevents+json")
	f.Add(int64(7), "id", "t", []byte(` [1, 2] `), "", "text/plain")
	f.Add(int64(7), "id", "t", []byte{}, "", "")
	f.Add(int64(8), "id", "t", []byte("Bon \"7\" <a&b>\n\x01\u00e9\u2028"), "", "")
	f.Fuzz(func(t *testing.T, seq int64, id, topic string, payload []byte, typ, ct string) {
		if seq < 0 {
			seq = -seq
		}
		if seq < 0 { // math.MinInt64
			seq = 0
		}
		for _, text := range []bool{false, true} {
			enc := encoder{source: "/dev/\"1\"", defaultType: DefaultEventType}
			m := &outgoing{seq: seq, id: id, topic: topic, payload: payload, text: text, typ: typ, contentType: ct, createdAt: 1_700_000_000_123}
			out, err := enc.encode(nil, m)
			if err != nil {
				if ValidateTopic(topic) == nil && id != "" && len(id) <= MaxIDBytes && len(typ) <= maxTypeBytes && len(ct) <= maxTypeBytes &&
					utf8.ValidString(id) && utf8.ValidString(typ) && utf8.ValidString(ct) {
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
			wantCT := ct
			if ct == "" {
				switch {
				case json.Valid(payload):
					wantCT = "application/json"
				case text && utf8.Valid(payload):
					wantCT = "text/plain; charset=utf-8"
				default:
					wantCT = "application/octet-stream"
				}
			}
			if ev.DataContentType != wantCT {
				t.Fatalf("text=%v: content type %q, want %q", text, ev.DataContentType, wantCT)
			}
			switch {
			case bytes.Contains(out, []byte(`"data_base64"`)):
				if !bytes.Equal(ev.Data, payload) {
					t.Fatalf("data %q, want %q", ev.Data, payload)
				}
			case wantCT == "text/plain; charset=utf-8" && ct == "":
				if !bytes.Equal(ev.Data, payload) {
					t.Fatalf("text data %q, want %q\n%s", ev.Data, payload, out)
				}
			case !bytes.Equal(ev.Data, bytes.TrimSpace(payload)):
				t.Fatalf("inline data %q, want %q", ev.Data, payload)
			}
			// Binary mode: the same event, the data byte for byte.
			enc.mode = EnvelopeCloudEventsBinary
			var props PublishProperties
			wire, err := enc.encodeBinary(nil, m, &props)
			if err != nil {
				if strings.ContainsRune(id+typ+ct, 0) {
					continue // no MQTT 5 property may hold U+0000
				}
				t.Fatalf("binary mode refused what structured mode took: %v", err)
			}
			bev, err := DecodeEventMQTT(wire, props.ContentType, props.User)
			if err != nil {
				t.Fatalf("binary decode: %v (%+v)", err, props)
			}
			ev.Data, bev.Data = payload, wire
			if !bytes.Equal(wire, payload) {
				t.Fatalf("binary data %q, want %q", wire, payload)
			}
			ev.Time, bev.Time = ev.Time.UTC(), bev.Time.UTC()
			if fmt.Sprint(bev) != fmt.Sprint(ev) {
				t.Fatalf("binary mode %+v, structured %+v", bev, ev)
			}
		}
	})
}

func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(`{"specversion":"1.0","id":"1","source":"s","type":"t","data":{"x":1}}`))
	f.Add([]byte(`{"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"AAE=","sequence":"0042","time":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"specversion":"0.3"}`))
	f.Add([]byte(`not json`))
	f.Add([]byte(`{"specversion":"1.0","id":"1","source":"s","type":"t","datacontenttype":"text/plain; charset=utf-8","data":"a \"b\"\n\u00e9"}`))
	f.Add([]byte(`{"specversion":"1.0","id":"1","source":"s","type":"t","datacontenttype":"application/json","data":"a"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := DecodeEvent(b)
		if err != nil {
			return
		}
		if ev.ID == "" || ev.Source == "" || ev.Type == "" {
			t.Fatalf("accepted an event without id, source or type: %s", b)
		}
		// A string of a non-JSON content type is the data itself.
		var doc struct {
			DataContentType string `json:"datacontenttype"`
			Data            any    `json:"data"`
		}
		if json.Unmarshal(b, &doc) == nil {
			if s, ok := doc.Data.(string); ok && doc.DataContentType != "" && !isJSONContentType(doc.DataContentType) && string(ev.Data) != s {
				t.Fatalf("string data decoded as %q, want %q: %s", ev.Data, s, b)
			}
		}
		if ev.Sequence < 0 {
			return // the relay never writes one
		}
		// What was decoded, enqueued again as a BLOB or as TEXT, comes back
		// the same from the relay's envelope.
		for _, text := range []bool{false, true} {
			enc := encoder{source: ev.Source, defaultType: DefaultEventType}
			m := &outgoing{seq: ev.Sequence, id: ev.ID, topic: "t", payload: ev.Data, text: text, typ: ev.Type, contentType: ev.DataContentType}
			out, err := enc.encode(nil, m)
			if err != nil {
				t.Fatalf("encode %+v: %v", ev, err)
			}
			ev2, err := DecodeEvent(out)
			if err != nil {
				t.Fatalf("decode: %v\n%s", err, out)
			}
			if ev2.ID != ev.ID || ev2.Source != ev.Source || ev2.Type != ev.Type || ev2.Sequence != ev.Sequence ||
				(ev.DataContentType != "" && ev2.DataContentType != ev.DataContentType) {
				t.Fatalf("round trip: %+v, want %+v", ev2, ev)
			}
			want := ev.Data
			if isJSONContentType(ev2.DataContentType) && !bytes.Contains(out, []byte(`"data_base64"`)) {
				want = bytes.TrimSpace(want) // inline JSON, its spaces around dropped
			}
			if !bytes.Equal(ev2.Data, want) {
				t.Fatalf("text=%v: data %q, want %q\n%s", text, ev2.Data, want, out)
			}
		}
	})
}

// FuzzDecodeEventMQTT: whatever arrives over MQTT 5, DecodeEventMQTT never
// panics, accepts no event without id, source and type, takes binary mode's
// payload as the data untouched, and what it decoded from binary mode comes
// back the same from the relay's binary encoding. The user properties come
// as lines of key=value.
func FuzzDecodeEventMQTT(f *testing.F) {
	f.Add([]byte(`{"n":1}`), "application/json", "specversion=1.0\nid=1\nsource=/s\ntype=t\ntime=2026-01-01T00:00:00.000Z\nsequence=00000000000000000042")
	f.Add([]byte{0, 1, 0xff}, "", "specversion=1.0\nid=1\nsource=s\ntype=t\nother=x")
	f.Add([]byte(`{"specversion":"1.0","id":"1","source":"s","type":"t","data":{"x":1}}`), "application/cloudevents+json", "")
	f.Add([]byte("x"), "text/plain", "specversion=1.0\nid=1\nid=2\nsource=s\ntype=t")
	f.Add([]byte("x"), "", "specversion=0.3\nid=1\nsource=s\ntype=t")
	f.Fuzz(func(t *testing.T, payload []byte, ct, props string) {
		var user []UserProperty
		if props != "" {
			for _, line := range strings.Split(props, "\n") {
				k, v, _ := strings.Cut(line, "=")
				user = append(user, UserProperty{k, v})
			}
		}
		ev, err := DecodeEventMQTT(payload, ct, user)
		if err != nil {
			return
		}
		if ev.ID == "" || ev.Source == "" || ev.Type == "" {
			t.Fatalf("accepted an event without id, source or type: %+v", user)
		}
		binary := false
		for _, u := range user {
			binary = binary || u.Key == "specversion"
		}
		if !binary {
			return // structured: FuzzDecodeEvent's
		}
		if !bytes.Equal(ev.Data, payload) || ev.DataContentType != ct {
			t.Fatalf("binary mode data %q (%q), want %q (%q)", ev.Data, ev.DataContentType, payload, ct)
		}
		if ev.Sequence < 0 || !utf8.ValidString(ev.ID+ev.Source+ev.Type+ct) || strings.ContainsRune(ev.ID+ev.Source+ev.Type+ct, 0) ||
			len(ev.ID) > MaxIDBytes || len(ev.Type) > maxTypeBytes || len(ct) > maxTypeBytes {
			return // the relay never writes these: Enqueue and the schema refuse them
		}
		enc := encoder{source: ev.Source, defaultType: DefaultEventType, mode: EnvelopeCloudEventsBinary}
		m := &outgoing{seq: ev.Sequence, id: ev.ID, topic: "t", payload: ev.Data, typ: ev.Type, contentType: ct, createdAt: ev.Time.UnixMilli()}
		var out PublishProperties
		wire, err := enc.encodeBinary(nil, m, &out)
		if err != nil {
			t.Fatalf("encode %+v: %v", ev, err)
		}
		ev2, err := DecodeEventMQTT(wire, out.ContentType, out.User)
		if err != nil {
			t.Fatalf("decode: %v (%+v)", err, out)
		}
		if ev2.ID != ev.ID || ev2.Source != ev.Source || ev2.Type != ev.Type || ev2.Sequence != ev.Sequence ||
			(ct != "" && ev2.DataContentType != ct) || !bytes.Equal(ev2.Data, payload) {
			t.Fatalf("round trip: %+v, want %+v", ev2, ev)
		}
	})
}

// FuzzDecodeEventsMQTT: whatever arrives, DecodeEventsMQTT and
// DecodeRawMQTT never panic and stay bounded: 1 to 65,535 events or
// payloads, or an error and none; every event has an id, source and type,
// and a batch's event is what DecodeEvent reads from its own document. The
// seeds are the test vectors but the bombs (testdata/batching); the user
// properties come as lines of key=value.
func FuzzDecodeEventsMQTT(f *testing.F) {
	files, err := filepath.Glob(filepath.Join(vectorDir, "*.json"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no vectors: %v", err)
	}
	for _, file := range files {
		if strings.Contains(file, "bomb") {
			continue // seconds each under -race
		}
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		var v batchVector
		if err := json.Unmarshal(b, &v); err != nil {
			f.Fatal(err)
		}
		payload, err := base64.StdEncoding.DecodeString(v.PayloadBase64)
		if err != nil {
			f.Fatal(err)
		}
		var lines []string
		for _, p := range v.UserProperties {
			lines = append(lines, p[0]+"="+p[1])
		}
		f.Add(payload, v.ContentType, strings.Join(lines, "\n"))
	}
	f.Add([]byte(`[{"specversion":"1.0","id":"1","source":"s","type":"t"},{"specversion":"1.0","id":"2","source":"s","type":"t","data":[1]}]`), "", "")
	f.Add([]byte{1, 'a', 0, 2, 'b', 'c'}, rawBatchContentType, "")
	f.Fuzz(func(t *testing.T, payload []byte, ct, props string) {
		var user []UserProperty
		if props != "" {
			for _, line := range strings.Split(props, "\n") {
				k, v, _ := strings.Cut(line, "=")
				user = append(user, UserProperty{k, v})
			}
		}
		parts, err := DecodeEventPartsMQTT(payload, ct, user)
		evs, err2 := DecodeEventsMQTT(payload, ct, user)
		if (err == nil) != (err2 == nil) || len(evs) != len(parts) {
			t.Fatalf("DecodeEventsMQTT and DecodeEventPartsMQTT disagree: %v, %v", err, err2)
		}
		if err != nil {
			if parts != nil {
				t.Fatalf("events with an error: %v", err)
			}
		} else {
			if len(parts) < 1 || len(parts) > maxBatchEvents {
				t.Fatalf("%d events", len(parts))
			}
			for i, p := range parts {
				if p.Event.ID == "" || p.Event.Source == "" || p.Event.Type == "" {
					t.Fatalf("event %d without id, source or type: %+v", i, p.Event)
				}
				if !binaryMode(user) {
					ev, err := DecodeEvent(p.Bytes)
					if err != nil || fmt.Sprint(ev) != fmt.Sprint(p.Event) {
						t.Fatalf("event %d is not its document's: %v", i, err)
					}
				}
			}
		}
		raws, err := DecodeRawMQTT(payload, ct, user)
		if err != nil {
			if raws != nil {
				t.Fatalf("payloads with an error: %v", err)
			}
			return
		}
		if len(raws) < 1 || len(raws) > maxBatchEvents {
			t.Fatalf("%d payloads", len(raws))
		}
		var n int
		for _, r := range raws {
			n += len(r)
		}
		if n > max(len(payload), MaxBatchBytesLimit) {
			t.Fatalf("%d bytes of payloads from %d", n, len(payload))
		}
	})
}

// validJSONCases are the seeds of FuzzValidJSON and the cases of
// TestValidJSON: each side of every rule of the grammar.
var validJSONCases = []string{
	``, ` `, `{}`, `[]`, ` { } `, `[ ]`, `{"a":1}`, `{"a" : [1, 2.5, -3e+7, 0, -0.0E-1]}`,
	`{"a":1,}`, `[1,]`, `[,1]`, `{,}`, `{"a"}`, `{"a":}`, `{1:2}`, `{"a":1 "b":2}`, `[1 2]`,
	`"x"`, `"\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00"`, `"\x"`, `"\u12"`, `"\u12g4"`, "\"a\x01\"", "\"a\x7f\xff\"", `"`, `"a`, `"\`,
	`true`, `false`, `null`, `tru`, `nul`, `truee`, `True`, `nulll`,
	`0`, `-0`, `01`, `-`, `1.`, `.5`, `1e`, `1e+`, `1E-0`, `+1`, `1.5e3`, `-01`, `0x10`, `1_000`,
	`[[[[]]]]`, `[[[[]]]`, `[{"a":[{"b":null}]}]`, `{"a":{"b":{}}}}`, `]`, `}`, `{]`, `[}`,
	"\t\n\r [1]\r\n", "\v[1]", "[1]\x00", `[1] [2]`, `{"a":1}x`,
	strings.Repeat("[", 63) + strings.Repeat("]", 63), strings.Repeat("[", 64) + strings.Repeat("]", 64),
	strings.Repeat("[", 65) + strings.Repeat("]", 65), strings.Repeat("[", 65) + strings.Repeat("]", 64),
	strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 70), strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 69),
}

// FuzzValidJSON holds the relay's JSON check to json.Valid's answer.
func FuzzValidJSON(f *testing.F) {
	for _, s := range validJSONCases {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid says %v", b, got, want)
		}
	})
}

// FuzzTopicSchemaAgrees: the schema refuses at INSERT exactly the topics
// ValidateTopic refuses, among those SQLite can store as text (valid
// UTF-8, no NUL) and that the schema's CHECK does not refuse by itself.
func FuzzTopicSchemaAgrees(f *testing.F) {
	for _, s := range append(append([]string{"a", "$", "a$", "\u0080", "\u00a0", "\ufdcf\ufdd0", "\U0001fffe", "\U0001fffd"}, badTopics...), goodTopics...) {
		f.Add(s)
	}
	ob := openTest(f, Options{})
	st, err := ob.DB().Prepare(`INSERT INTO outbox (topic, payload) VALUES (?, x'') RETURNING seq`)
	if err != nil {
		f.Fatal(err)
	}
	defer st.Close()
	f.Fuzz(func(t *testing.T, topic string) {
		if topic == "" || !utf8.ValidString(topic) || strings.ContainsAny(topic, "+#\x00") || len(topic) > 65535 {
			return
		}
		var seq int64
		sqlErr := st.QueryRow(topic).Scan(&seq)
		if sqlErr == nil {
			if _, err := ob.DB().Exec(`DELETE FROM outbox WHERE seq = ?`, seq); err != nil {
				t.Fatal(err)
			}
		}
		if goErr := ValidateTopic(topic); (goErr == nil) != (sqlErr == nil) {
			t.Fatalf("topic %q: ValidateTopic says %v, the schema %v", topic, goErr, sqlErr)
		}
	})
}
