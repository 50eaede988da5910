package bench

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/edgeoutbox/outbox"
)

// instantPublisher acknowledges every publish at once and sends nothing:
// a drain through it costs what the relay itself costs a message (reads,
// encoding, dispatch, marks), the floor beneath any transport's.
type instantPublisher struct {
	n         int64 // publishes until done
	published atomic.Int64
	last      atomic.Int64 // unix nanoseconds of the n-th publish
	done      chan struct{}
}

func newInstantPublisher(n int) *instantPublisher {
	return &instantPublisher{n: int64(n), done: make(chan struct{})}
}

// instantToken is a publish already acknowledged.
type instantToken struct{}

var acknowledged = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

func (instantToken) Done() <-chan struct{} { return acknowledged }
func (instantToken) Error() error          { return nil }

func (p *instantPublisher) Connect(context.Context) error { return nil }
func (p *instantPublisher) Disconnect()                   {}

func (p *instantPublisher) Publish(string, []byte) outbox.Token {
	if p.published.Add(1) == p.n {
		p.last.Store(time.Now().UnixNano())
		close(p.done)
	}
	return instantToken{}
}
