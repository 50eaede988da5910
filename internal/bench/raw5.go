package bench

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// structuredContentType is what the relay sends as the Content Type of a
// structured-mode message over MQTT 5; the raw publisher sends it too, so
// that both put the same bytes on the wire.
const structuredContentType = "application/cloudevents+json"

// drainRaw5 is drainRaw over MQTT 5 with paho.golang's Client, the peer a
// user would pick for 5. Its Publish waits for the PUBACK, so window
// goroutines publish side by side; the client keeps within the broker's
// Receive Maximum, as the relay does. Their deliveries interleave: this
// measures the rate, not order.
func drainRaw5(ctx context.Context, b broker, msgs [][]byte, window int) (drainRun, error) {
	tr := newOrderTracker(len(msgs))
	b.setHandler(tr.handle)
	defer b.setHandler(nil)
	u, err := url.Parse(b.url())
	if err != nil {
		return drainRun{}, err
	}
	start := time.Now()
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		return drainRun{}, err
	}
	c := paho.NewClient(paho.ClientConfig{ClientID: "bench-raw5", Conn: conn})
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	ca, err := c.Connect(cctx, &paho.Connect{ClientID: "bench-raw5", KeepAlive: 30, CleanStart: true})
	cancel()
	if err != nil {
		conn.Close()
		return drainRun{}, fmt.Errorf("connect %s (MQTT 5): %w", b.url(), err)
	}
	if ca.ReasonCode != 0 {
		conn.Close()
		return drainRun{}, fmt.Errorf("connect %s (MQTT 5): reason code %d", b.url(), ca.ReasonCode)
	}
	defer func() {
		c.Disconnect(&paho.Disconnect{ReasonCode: 0})
		<-c.Done()
	}()
	pctx, cancel := context.WithTimeout(ctx, drainTimeout(len(msgs), window))
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, window)
	for g := 0; g < window; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(msgs) || pctx.Err() != nil {
					return
				}
				_, err := c.Publish(pctx, &paho.Publish{QoS: 1, Topic: benchTopic, Payload: msgs[i],
					Properties: &paho.PublishProperties{ContentType: structuredContentType}})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return drainRun{}, fmt.Errorf("MQTT 5 publish: %w", err)
	default:
	}
	if err := tr.wait(ctx, drainTimeout(len(msgs), window)); err != nil {
		return drainRun{}, err
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return drainRun{rate: float64(len(msgs)) / tr.last.Sub(start).Seconds(), dups: tr.dups}, nil
}
