package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
)

// Order events are the payloads of every compression figure: what a till
// sends, where the padded payloads of the other sections are all `x` and
// compress to nothing. Their generator has a fixed seed, so every run
// compresses the same bytes; BENCHMARKS.md shows one and their mean size.

// orderSeed seeds the generator (math/rand/v2's PCG).
const orderSeed1, orderSeed2 = 0x6f7574626f78, 34

// orderStore and orderTill are the device's: a till's events all name them.
const (
	orderStore = "store-0042"
	orderTill  = 3
)

// orderLine is one line of an order.
type orderLine struct {
	SKU        string `json:"sku"`
	Qty        int    `json:"qty"`
	PriceCents int    `json:"price_cents"`
}

// orderEvent is a till's order: its number (the day's count), the store,
// the till, the cashier, one to three lines and the total.
type orderEvent struct {
	Order      int         `json:"order"`
	Store      string      `json:"store"`
	Till       int         `json:"till"`
	Cashier    string      `json:"cashier"`
	Lines      []orderLine `json:"lines"`
	TotalCents int         `json:"total_cents"`
}

// catalogueItem is a product the store sells: an EAN-13 and its price.
type catalogueItem struct {
	sku        string
	priceCents int
}

// orderGen generates order events; the events of a generator made by
// newOrderGen, taken in turn, are the same in every run.
type orderGen struct {
	rng       *rand.Rand
	catalogue []catalogueItem
	cashiers  []string
}

func newOrderGen() *orderGen {
	g := &orderGen{rng: rand.New(rand.NewPCG(orderSeed1, orderSeed2))}
	for range 400 {
		// A 13-digit article number: a GS1 prefix, then the item.
		g.catalogue = append(g.catalogue, catalogueItem{
			sku:        fmt.Sprintf("40%011d", g.rng.Int64N(1e11)),
			priceCents: 49 + 10*g.rng.IntN(300),
		})
	}
	for range 4 {
		g.cashiers = append(g.cashiers, fmt.Sprintf("c-%04d", 1000+g.rng.IntN(9000)))
	}
	return g
}

// next returns the order numbered order as JSON: one line in half the
// orders, two in 30 %, three in 20 %; a few items sell far more than the
// rest; most quantities are 1.
func (g *orderGen) next(order int) []byte {
	e := orderEvent{Order: order, Store: orderStore, Till: orderTill, Cashier: g.cashiers[(order/250)%len(g.cashiers)]}
	lines := 1
	switch p := g.rng.IntN(10); {
	case p >= 8:
		lines = 3
	case p >= 5:
		lines = 2
	}
	for range lines {
		it := g.catalogue[g.rng.IntN(g.rng.IntN(len(g.catalogue))+1)]
		qty := 1
		if g.rng.IntN(5) == 0 {
			qty = 2 + g.rng.IntN(4)
		}
		e.Lines = append(e.Lines, orderLine{SKU: it.sku, Qty: qty, PriceCents: it.priceCents})
		e.TotalCents += qty * it.priceCents
	}
	b, err := json.Marshal(e)
	if err != nil {
		panic(err) // a struct of strings and ints always marshals
	}
	return b
}

// orderPayloads returns the orders numbered first, first+1, … of n events
// from a fresh generator.
func orderPayloads(first, n int) [][]byte {
	g := newOrderGen()
	out := make([][]byte, n)
	for i := range out {
		out[i] = g.next(first + i)
	}
	return out
}

// meanLen is the mean length of ps.
func meanLen(ps [][]byte) float64 {
	t := 0
	for _, p := range ps {
		t += len(p)
	}
	return float64(t) / float64(max(len(ps), 1))
}

var orderKey = []byte(`"order":`)

// orderNumbers returns the order numbers in a payload, in order: one for
// an event, each of a batch's.
func orderNumbers(b []byte) []int {
	var out []int
	for {
		i := bytes.Index(b, orderKey)
		if i < 0 {
			return out
		}
		b = b[i+len(orderKey):]
		n, j := 0, 0
		for ; j < len(b) && b[j] >= '0' && b[j] <= '9'; j++ {
			n = n*10 + int(b[j]-'0')
		}
		if j > 0 {
			out = append(out, n)
		}
	}
}
