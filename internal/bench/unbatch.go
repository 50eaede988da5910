package bench

import (
	"github.com/klauspost/compress/zstd"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/compress"
)

// unpacker undoes the relay's compression for section 3's subscriber. It
// keeps one zstd decoder: the subscriber runs in the broker's delivery
// path, before its PUBACK, where a decoder made per message
// (compress.Decompress's, a consumer's safeguard against untrusted
// payloads) would cost more than the relay's compression and be counted
// against it.
type unpacker struct {
	zd *zstd.Decoder
}

func newUnpacker() (*unpacker, error) {
	zd, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(2), zstd.WithDecoderMaxMemory(outbox.MaxBatchBytesLimit))
	if err != nil {
		return nil, err
	}
	return &unpacker{zd: zd}, nil
}

func (u *unpacker) close() { u.zd.Close() }

// unpack returns a message's payload as the relay encoded it before
// compression: a compressed one, told by its magic bytes (as over MQTT
// 3.1.1), decompressed.
func (u *unpacker) unpack(p []byte) ([]byte, error) {
	switch compress.Sniff(p) {
	case compress.Zstd:
		return u.zd.DecodeAll(p, nil)
	case compress.Gzip:
		return compress.Decompress(compress.Gzip, p, outbox.MaxBatchBytesLimit)
	}
	return p, nil
}

// orders returns the order numbers of the events a message carries; none
// if it cannot be decompressed.
func (u *unpacker) orders(p []byte) []int {
	p, err := u.unpack(p)
	if err != nil {
		return nil
	}
	return orderNumbers(p)
}
