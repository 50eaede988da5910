package outbox

import (
	"encoding/json"
	"testing"
)

func TestValidJSON(t *testing.T) {
	valid := 0
	for _, s := range validJSONCases {
		if got, want := validJSON([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Errorf("validJSON(%q) = %v, json.Valid says %v", s, got, want)
		}
		if json.Valid([]byte(s)) {
			valid++
		}
	}
	// The cases are not all one answer.
	if valid < 20 || len(validJSONCases)-valid < 20 {
		t.Fatalf("%d of %d cases valid", valid, len(validJSONCases))
	}
}

// BenchmarkValidJSON: the payload of outboxlab bench's drain.
func BenchmarkValidJSON(b *testing.B) {
	payload := []byte(`{"order":123456,"store":"42","lines":[{"sku":"A-1001","qty":2,"price":4.5},{"sku":"B-2002","qty":1,"price":12.25}],"total":21.25,"paid":true,"note":"no onions, extra sauce, thanks"}`)
	b.Run("validJSON", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for range b.N {
			if !validJSON(payload) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("json.Valid", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for range b.N {
			if !json.Valid(payload) {
				b.Fatal("invalid")
			}
		}
	})
}
