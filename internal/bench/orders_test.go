package bench

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/compress"
)

// TestOrderEvents: the generator gives the same events every run, each an
// order of one to three lines whose total adds up, with every order
// number found again by orderNumbers; the mean size is the one
// BENCHMARKS.md gives.
func TestOrderEvents(t *testing.T) {
	a := orderPayloads(1, 30_000)
	require.Equal(t, a[:3000], orderPayloads(1, 3000), "a fixed seed")
	lines := map[int]int{}
	for i, p := range a[:3000] {
		var e orderEvent
		require.NoError(t, json.Unmarshal(p, &e))
		require.Equal(t, i+1, e.Order)
		require.Equal(t, []int{i + 1}, orderNumbers(p))
		require.True(t, len(e.Lines) >= 1 && len(e.Lines) <= 3, string(p))
		sum := 0
		for _, l := range e.Lines {
			require.Len(t, l.SKU, 13)
			sum += l.Qty * l.PriceCents
		}
		require.Equal(t, sum, e.TotalCents)
		lines[len(e.Lines)]++
	}
	require.Len(t, lines, 3)
	t.Logf("first: %s", a[0])
	t.Logf("mean %.1f B, lines %v", meanLen(a), lines)
	require.InDelta(t, 178.9, meanLen(a), 0.05, "BENCHMARKS.md's mean size")
}

// TestUnpackerOrders: section 3's subscriber's view of a message: the
// order numbers of one event, of a batch, compressed with zstd or gzip;
// none of a compressed payload it cannot read.
func TestUnpackerOrders(t *testing.T) {
	batches := orderBatches(2, 3)
	one := envelope(7, "id-7", time.Now(), orderPayloads(7, 1)[0])
	c, err := compress.NewCompressor(compress.Zstd)
	require.NoError(t, err)
	defer c.Close()
	g, err := compress.NewCompressor(compress.Gzip)
	require.NoError(t, err)
	defer g.Close()
	u, err := newUnpacker()
	require.NoError(t, err)
	defer u.close()
	for _, x := range []struct {
		p    []byte
		want []int
	}{
		{one, []int{7}},
		{batches[1], []int{4, 5, 6}},
		{c.Append(nil, batches[0]), []int{1, 2, 3}},
		{g.Append(nil, batches[1]), []int{4, 5, 6}},
	} {
		require.Equal(t, x.want, u.orders(x.p))
	}
	z := c.Append(nil, batches[0])
	require.Empty(t, u.orders(z[:len(z)/2]), "a truncated frame")
}
