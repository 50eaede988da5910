package natsjs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/natsjs"
)

// BenchmarkPublish publishes structured-mode envelopes, as the relay
// encodes them, to an R1 stream with 64 in flight: the Publisher's own cost
// a message beside nats.go's (outboxlab bench section 11 has the relay's).
func BenchmarkPublish(b *testing.B) {
	n := harness.StartNATS(b)
	nc, err := nats.Connect("nats://" + n.Addr)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		b.Fatal(err)
	}
	pub, err := natsjs.New(natsjs.Options{Servers: []string{"nats://" + n.Addr}})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Disconnect()
	if err := pub.Connect(ctx); err != nil {
		b.Fatal(err)
	}
	const window = 64
	pad := strings.Repeat("x", 200)
	var ring [window]outbox.Token
	i := 0
	for b.Loop() {
		if t := ring[i%window]; t != nil {
			select {
			case <-t.Done():
			case <-time.After(10 * time.Second):
				b.Fatal("no PubAck in 10 s")
			}
			if err := t.Error(); err != nil {
				b.Fatal(err)
			}
		}
		payload := fmt.Appendf(nil, `{"specversion":"1.0","id":"01J%023d","source":"/bench","type":"sale","datacontenttype":"application/json","data":{"pad":%q}}`, i, pad)
		ring[i%window] = pub.Publish("bench/sales", payload)
		i++
	}
	for _, t := range ring {
		if t != nil {
			<-t.Done()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(i, 1)), "ns/msg")
}
