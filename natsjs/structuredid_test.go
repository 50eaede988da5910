package natsjs

import (
	"bytes"
	"encoding/json"
	"testing"
)

// decodedID is structuredID by encoding/json alone: what the fast path
// must agree with.
func decodedID(payload []byte) string {
	rest, ok := bytes.CutPrefix(payload, []byte(structuredIDPrefix))
	if !ok {
		return ""
	}
	var id string
	if err := json.NewDecoder(bytes.NewReader(rest)).Decode(&id); err != nil {
		return ""
	}
	return id
}

// FuzzStructuredID: the id read without a decoder is the one encoding/json
// reads, whatever the bytes after the envelope's opening.
func FuzzStructuredID(f *testing.F) {
	for _, s := range []string{
		`"0191d7a2-7c1e-7b3a-9f00-1a2b3c4d5e6f","source":"/s"}`,
		`"a\"b","source":"/s"}`, `"caf\u00e9"}`, `"café"}`, "\"\xff\"}", "\"a\tb\"}",
		`""}`, `"unterminated`, `42}`, `"a\\"}`, `"\/"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, rest []byte) {
		payload := append([]byte(structuredIDPrefix), rest...)
		if got, want := structuredID(payload), decodedID(payload); got != want {
			t.Fatalf("structuredID(%q) = %q, encoding/json reads %q", payload, got, want)
		}
	})
}
