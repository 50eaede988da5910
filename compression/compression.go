// Package compression holds the compressors the relay can publish with
// (outbox.RelayOptions.Compress): Zstd and Gzip, in pure Go
// (klauspost/compress), the two that the library's Subscriber and
// DecodeEventsMQTT read (docs/batching.md).
//
// A program links them only if it imports this package: a till that does
// not compress does not carry them (about 0.5 MB on arm64).
package compression

import "github.com/edgeoutbox/outbox/internal/compress"

// Compressor compresses payloads; it is safe for concurrent use, so one
// may serve several relays.
type Compressor struct{ c *compress.Compressor }

// Zstd returns a Zstandard (RFC 8878) compressor: the smaller payloads
// (BENCHMARKS.md), one goroutine and a 1 MiB window.
func Zstd() *Compressor { return newCompressor(compress.Zstd) }

// Gzip returns a gzip (RFC 1952) compressor, for consumers that have no
// zstd.
func Gzip() *Compressor { return newCompressor(compress.Gzip) }

func newCompressor(alg compress.Alg) *Compressor {
	c, err := compress.NewCompressor(alg)
	if err != nil {
		// Its options are constants: only a broken build fails here.
		panic(err)
	}
	return &Compressor{c}
}

// ContentEncoding names the compression on the wire: "zstd" or "gzip"
// ("" for a nil Compressor, which the relay refuses).
func (c *Compressor) ContentEncoding() string {
	if c == nil {
		return ""
	}
	return c.c.Alg().String()
}

// AppendCompressed appends src compressed to dst.
func (c *Compressor) AppendCompressed(dst, src []byte) []byte { return c.c.Append(dst, src) }
