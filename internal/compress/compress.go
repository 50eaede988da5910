// Package compress is the relay's and the Subscriber's compression of a
// message's payload: gzip and zstd, in pure Go (klauspost/compress), with
// decompression bounded by the caller, whatever a payload declares.
package compress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// Alg is a compression algorithm.
type Alg int

const (
	None Alg = iota
	Gzip
	Zstd
)

// String is the algorithm's name on the wire (the content-encoding user
// property): "", "gzip" or "zstd".
func (a Alg) String() string {
	switch a {
	case Gzip:
		return "gzip"
	case Zstd:
		return "zstd"
	}
	return ""
}

// Parse reads a content-encoding: "gzip" or "zstd" ("identity" and ""
// are None).
func Parse(s string) (Alg, error) {
	switch s {
	case "", "identity":
		return None, nil
	case "gzip":
		return Gzip, nil
	case "zstd":
		return Zstd, nil
	}
	return None, fmt.Errorf("unknown content encoding %q", s)
}

// Sniff tells a compressed payload by its magic bytes: a zstd frame begins
// 28 B5 2F FD, a gzip member 1F 8B. Neither can begin a JSON document,
// which is how MQTT 3.1.1, without properties, says a structured payload
// is compressed.
func Sniff(p []byte) Alg {
	switch {
	case len(p) >= 4 && p[0] == 0x28 && p[1] == 0xb5 && p[2] == 0x2f && p[3] == 0xfd:
		return Zstd
	case len(p) >= 2 && p[0] == 0x1f && p[1] == 0x8b:
		return Gzip
	}
	return None
}

// ErrTooLarge is a payload that decompresses to more than the bound.
var ErrTooLarge = errors.New("decompresses to more than the limit")

// Compressor compresses payloads with one algorithm; it is safe for
// concurrent use.
type Compressor struct {
	alg  Alg
	zenc *zstd.Encoder
	gz   sync.Pool
}

// NewCompressor returns a Compressor for alg (Gzip or Zstd).
func NewCompressor(alg Alg) (*Compressor, error) {
	c := &Compressor{alg: alg}
	switch alg {
	case Zstd:
		// One goroutine and a small window: a till's CPU and memory are
		// small, and a payload is at most a batch.
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<20),
			zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithZeroFrames(true))
		if err != nil {
			return nil, err
		}
		c.zenc = enc
	case Gzip:
	default:
		return nil, fmt.Errorf("compress: no compressor for %v", alg)
	}
	return c, nil
}

// Alg is the Compressor's algorithm.
func (c *Compressor) Alg() Alg { return c.alg }

// Append appends src compressed to dst.
func (c *Compressor) Append(dst, src []byte) []byte {
	if c.alg == Zstd {
		return c.zenc.EncodeAll(src, dst)
	}
	w, _ := c.gz.Get().(*gzip.Writer)
	buf := bytes.NewBuffer(dst)
	if w == nil {
		w, _ = gzip.NewWriterLevel(buf, gzip.DefaultCompression)
	} else {
		w.Reset(buf)
	}
	w.Write(src) // a bytes.Buffer's writes do not fail
	w.Close()
	c.gz.Put(w)
	return buf.Bytes()
}

// Close releases the Compressor's resources.
func (c *Compressor) Close() {
	if c.zenc != nil {
		c.zenc.Close()
	}
}

// Decompress decompresses src, compressed with alg, refusing to produce
// more than limit bytes (ErrTooLarge) or to take more memory than that
// needs, whatever the payload's header declares.
func Decompress(alg Alg, src []byte, limit int) ([]byte, error) {
	var r io.Reader
	switch alg {
	case Zstd:
		// The decoder's window is bounded too, so a frame declaring a huge
		// window is refused before any allocation.
		d, err := zstd.NewReader(bytes.NewReader(src), zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderMaxMemory(uint64(max(limit, 1<<10))), zstd.WithDecoderMaxWindow(uint64(max(min(limit, 8<<20), zstd.MinWindowSize))),
			zstd.WithDecoderLowmem(true))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		defer d.Close()
		r = d
	case Gzip:
		g, err := gzip.NewReader(bytes.NewReader(src))
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		g.Multistream(false)
		r = g
	default:
		return nil, fmt.Errorf("compress: cannot decompress %v", alg)
	}
	// Grown by doubling, never past limit+1: a bomb costs at most that.
	out := make([]byte, 0, min(max(len(src)*4, 4<<10), limit+1))
	for {
		if len(out) == cap(out) {
			if len(out) > limit {
				return nil, fmt.Errorf("%s: %w of %d bytes", alg, ErrTooLarge, limit)
			}
			grown := make([]byte, len(out), min(2*cap(out), limit+1))
			copy(grown, out)
			out = grown
		}
		n, err := r.Read(out[len(out):cap(out)])
		out = out[:len(out)+n]
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
			return nil, fmt.Errorf("%s: %w of %d bytes", alg, ErrTooLarge, limit)
		}
		if err == io.EOF {
			if len(out) > limit {
				return nil, fmt.Errorf("%s: %w of %d bytes", alg, ErrTooLarge, limit)
			}
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", alg, err)
		}
	}
}
