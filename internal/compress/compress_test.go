package compress

import (
	"bytes"
	"errors"
	"testing"
)

func TestRoundTripAndBound(t *testing.T) {
	src := bytes.Repeat([]byte(`{"order":1,"sku":"A-1"},`), 1000)
	for _, alg := range []Alg{Gzip, Zstd} {
		c, err := NewCompressor(alg)
		if err != nil {
			t.Fatal(err)
		}
		z := c.Append([]byte("pre"), src)
		c.Close()
		if !bytes.HasPrefix(z, []byte("pre")) || Sniff(z[3:]) != alg || len(z) > len(src)/10 {
			t.Fatalf("%v: %d bytes, sniffed %v", alg, len(z), Sniff(z[3:]))
		}
		out, err := Decompress(alg, z[3:], len(src))
		if err != nil || !bytes.Equal(out, src) {
			t.Fatalf("%v: round trip: %v", alg, err)
		}
		// One byte less than it holds: refused, not truncated.
		if _, err := Decompress(alg, z[3:], len(src)-1); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("%v: over the limit: %v", alg, err)
		}
	}
}

func TestBombIsBounded(t *testing.T) {
	c, _ := NewCompressor(Zstd)
	defer c.Close()
	bomb := c.Append(nil, make([]byte, 64<<20))
	if _, err := Decompress(Zstd, bomb, 1<<20); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a 64 MiB bomb under a 1 MiB limit: %v", err)
	}
}

func TestSniffJSON(t *testing.T) {
	for _, p := range []string{`{"a":1}`, `[1]`, ``, "\x1f"} {
		if Sniff([]byte(p)) != None {
			t.Fatalf("%q sniffed as compressed", p)
		}
	}
}
