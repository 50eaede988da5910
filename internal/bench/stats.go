package bench

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// median of xs (which it sorts); NaN for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// dist summarises latencies: p50, p99 and max in milliseconds.
type dist struct {
	N   int
	P50 float64
	P99 float64
	Max float64
}

// summarize sorts ds and returns their p50, p99 and max (nearest rank).
func summarize(ds []time.Duration) dist {
	if len(ds) == 0 {
		return dist{P50: math.NaN(), P99: math.NaN(), Max: math.NaN()}
	}
	slices.Sort(ds)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(ds)))) - 1
		return ds[min(max(i, 0), len(ds)-1)]
	}
	return dist{N: len(ds), P50: ms(rank(0.50)), P99: ms(rank(0.99)), Max: ms(ds[len(ds)-1])}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (d dist) String() string {
	return fmt.Sprintf("p50 %s / p99 %s / max %s", fmtMS(d.P50), fmtMS(d.P99), fmtMS(d.Max))
}

// fmtMS prints milliseconds with sensible precision.
func fmtMS(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v < 1:
		return fmt.Sprintf("%.2f ms", v)
	case v < 100:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}

// payload returns an event payload of exactly size bytes of JSON that
// carries n, so that a subscriber can tell which commit it belongs to.
func payload(n int, size int) []byte {
	b := fmt.Appendf(nil, `{"n":%d,"order":"ord-%08d","store":42,"total_cents":%d,"pad":"`, n, n, 100+n%9000)
	for len(b) < size-2 {
		b = append(b, 'x')
	}
	return append(b, '"', '}')
}

var nKey = []byte(`"n":`)

// parseN finds the "n" of a payload made by payload, also inside an
// envelope; -1 if there is none.
func parseN(b []byte) int {
	i := bytes.Index(b, nKey)
	if i < 0 {
		return -1
	}
	i += len(nKey)
	n := 0
	j := i
	for ; j < len(b) && b[j] >= '0' && b[j] <= '9'; j++ {
		n = n*10 + int(b[j]-'0')
	}
	if j == i {
		return -1
	}
	return n
}

var seqKey = []byte(`"sequence":"`)

// parseSeq reads the CloudEvents sequence extension of an envelope; -1 if
// there is none.
func parseSeq(b []byte) int64 {
	i := bytes.Index(b, seqKey)
	if i < 0 {
		return -1
	}
	i += len(seqKey)
	j := bytes.IndexByte(b[i:], '"')
	if j < 0 {
		return -1
	}
	n, err := strconv.ParseInt(string(b[i:i+j]), 10, 64)
	if err != nil {
		return -1
	}
	return n
}
