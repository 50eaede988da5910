package outbox

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Plain-SQL writers (Python, shell) often store the payload as TEXT. A TEXT
// payload that is valid UTF-8 but not JSON goes out as text/plain with the
// text as a JSON string; a BLOB stays octet-stream/base64 even when its
// bytes happen to be text, and a TEXT that is not valid UTF-8 too.
func TestRelayTextPayloadFromPlainSQL(t *testing.T) {
	forProtocols(t, testRelayTextPayloadFromPlainSQL)
}

func testRelayTextPayloadFromPlainSQL(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.PollInterval = 5 * time.Millisecond
	startRelay(t, mqttRelayOn(t, ob, b.url(), opts, proto))

	const receipt = "Bon 17: 2 × Kaffee \"groß\" <3> & 50% \\ done\tok"
	const text = "text/plain; charset=utf-8"
	cases := []struct {
		insert   string
		args     []any
		ct       string
		data     string // what DecodeEvent returns
		wire     string // the raw "data" member, or the data_base64 string
		inBase64 bool
	}{
		{insert: `INSERT INTO outbox (topic, payload) VALUES ('shop/1', 'Bon 17: 2 × Kaffee "groß" <3> & 50% \ done' || char(9) || 'ok' || char(10, 1))`,
			ct: text, data: receipt + "\n\x01", wire: `"Bon 17: 2 × Kaffee \"groß\" \u003c3\u003e \u0026 50% \\ done\tok\n\u0001"`},
		// A Go string bound to a parameter is TEXT, as Python's str is.
		{insert: `INSERT INTO outbox (topic, payload) VALUES (?, ?)`, args: []any{"shop/1", "till 7 closed"},
			ct: text, data: "till 7 closed", wire: `"till 7 closed"`},
		{insert: `INSERT INTO outbox (topic, payload) VALUES ('shop/1', '')`, ct: text, data: "", wire: `""`},
		{insert: `INSERT INTO outbox (topic, payload) VALUES ('shop/1', '{"total": 12.5}')`,
			ct: "application/json", data: `{"total": 12.5}`, wire: `{"total": 12.5}`},
		{insert: `INSERT INTO outbox (topic, payload) VALUES ('shop/1', X'68656C6C6F')`,
			ct: "application/octet-stream", data: "hello", wire: "aGVsbG8=", inBase64: true},
		{insert: `INSERT INTO outbox (topic, payload) VALUES ('shop/1', CAST(X'FF61' AS TEXT))`,
			ct: "application/octet-stream", data: "\xffa", wire: "/2E=", inBase64: true},
	}
	for _, c := range cases {
		_, err := ob.DB().Exec(c.insert, c.args...)
		require.NoError(t, err)
	}
	eventually(t, 5*time.Second, "all delivered", func() bool { return b.rec.Count() == len(cases) })
	for i, d := range b.rec.All() {
		c := cases[i]
		require.NoError(t, d.evErr)
		require.EqualValues(t, i+1, d.ev.Sequence, "in commit order")
		var doc map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(d.payload, &doc), "%s", d.payload)
		var ct string
		require.NoError(t, json.Unmarshal(doc["datacontenttype"], &ct))
		require.Equal(t, c.ct, ct, "row %d: %s", i+1, d.payload)
		if c.inBase64 {
			require.NotContains(t, doc, "data")
			require.Equal(t, `"`+c.wire+`"`, string(doc["data_base64"]), "row %d", i+1)
		} else {
			require.NotContains(t, doc, "data_base64", "row %d: %s", i+1, d.payload)
			require.Equal(t, c.wire, string(doc["data"]), "row %d", i+1)
		}
		require.Equal(t, c.ct, d.ev.DataContentType)
		require.Equal(t, c.data, string(d.ev.Data), "row %d: decoded", i+1)
	}
}

// Per the CloudEvents JSON format, a string data member of a non-JSON
// content type carries the text itself; with a JSON content type (or none,
// which means JSON) the data is the JSON value, quotes and all.
func TestDecodeEventStringData(t *testing.T) {
	for _, c := range []struct {
		ct, data, want string
	}{
		{`"text/plain; charset=utf-8"`, `"a \"b\"\n\u00e9"`, "a \"b\"\né"},
		{`"text/csv"`, `"1,2"`, "1,2"},
		{`"application/json"`, `"a"`, `"a"`},
		{`"application/cloudevents+json"`, `"a"`, `"a"`},
		{`""`, `"a"`, `"a"`},
		{`"text/plain"`, `{"x":1}`, `{"x":1}`},
	} {
		doc := `{"specversion":"1.0","id":"1","source":"s","type":"t","datacontenttype":` + c.ct + `,"data":` + c.data + `}`
		ev, err := DecodeEvent([]byte(doc))
		require.NoError(t, err, doc)
		require.Equal(t, c.want, string(ev.Data), doc)
	}
}
