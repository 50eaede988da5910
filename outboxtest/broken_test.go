package outboxtest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/outboxtest"
)

// Every case must be able to fail: TestSuiteCatches runs a case against a
// transport broken in the way the case guards against, in a child process
// (a failing subtest fails its parent), and checks that it fails, saying
// why.

// brokenEnv names the broken transport the child runs.
const brokenEnv = "OUTBOXTEST_BROKEN"

// breakages are the broken transports: what is broken, the case that must
// catch it, and what its failure says.
var breakages = []struct {
	name, caseName, says string
	transport            func() outboxtest.Transport
}{
	{"loses a message", "order", "not every committed event delivered",
		func() outboxtest.Transport {
			return wrapped(func(p outbox.Publisher) outbox.Publisher { return &losing{Publisher: p, at: 50} })
		}},
	{"delivers a message twice", "order", "duplicates",
		func() outboxtest.Transport {
			return wrapped(func(p outbox.Publisher) outbox.Publisher { return &doubling{Publisher: p, at: 50} })
		}},
	{"reorders two messages", "order", "first deliveries out of commit order",
		func() outboxtest.Transport {
			return wrapped(func(p outbox.Publisher) outbox.Publisher { return &swapping{Publisher: p, at: 50} })
		}},
	{"refuses for now, said to refuse for good", "refusals_parked_with_their_reason", "dead at the first, permanent, refusal",
		func() outboxtest.Transport {
			tr := fakeTransport(outboxtest.RefusedForNow)
			tr.Features.Refusal = outboxtest.RefusedForGood
			return tr
		}},
	{"hides its broker's limit", "the_window/a_broker's_smaller_limit", "tells it (outbox.WindowLimiter)",
		func() outboxtest.Transport {
			return wrapped(func(p outbox.Publisher) outbox.Publisher { return struct{ outbox.Publisher }{p} })
		}},
	{"leaks a goroutine", "shutdown", "found unexpected goroutines",
		func() outboxtest.Transport {
			return wrapped(func(p outbox.Publisher) outbox.Publisher { return &leaking{Publisher: p} })
		}},
}

func TestSuiteCatches(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the suite in child processes")
	}
	for _, b := range breakages {
		t.Run(b.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestBroken$/^"+b.caseName+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), brokenEnv+"="+b.name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the %s case passed against a transport that %s:\n%s", b.caseName, b.name, out)
			}
			if !strings.Contains(string(out), b.says) {
				t.Fatalf("the %s case failed against a transport that %s, without saying %q:\n%s", b.caseName, b.name, b.says, out)
			}
		})
	}
}

// TestBroken runs the suite against the broken transport brokenEnv names;
// it runs only as TestSuiteCatches's child.
func TestBroken(t *testing.T) {
	name := os.Getenv(brokenEnv)
	if name == "" {
		t.Skip("runs as TestSuiteCatches's child")
	}
	for _, b := range breakages {
		if b.name == name {
			outboxtest.Run(t, b.transport())
			return
		}
	}
	t.Fatalf("no broken transport %q", name)
}

// wrapped is the fake transport whose Publishers are wrap's.
func wrapped(wrap func(outbox.Publisher) outbox.Publisher) outboxtest.Transport {
	tr := fakeTransport(outboxtest.RefusedForGood)
	for _, ctor := range []*func(*testing.T) outboxtest.Broker{&tr.Broker, &tr.Refusing} {
		inner := *ctor
		*ctor = func(t *testing.T) outboxtest.Broker {
			b := inner(t)
			pub := b.Publisher
			b.Publisher = func() outbox.Publisher { return wrap(pub()) }
			return b
		}
	}
	limited := tr.Limited
	tr.Limited = func(t *testing.T, limit int) outboxtest.Broker {
		b := limited(t, limit)
		pub := b.Publisher
		b.Publisher = func() outbox.Publisher { return wrap(pub()) }
		return b
	}
	return tr
}

// acked is a token acknowledged already.
type acked struct{}

func (acked) Done() <-chan struct{} { c := make(chan struct{}); close(c); return c }
func (acked) Error() error          { return nil }

// losing acknowledges its at-th publish without sending it.
type losing struct {
	outbox.Publisher
	n, at int
}

func (p *losing) Publish(topic string, payload []byte) outbox.Token {
	if p.n++; p.n == p.at {
		return acked{}
	}
	return p.Publisher.Publish(topic, payload)
}

// doubling sends its at-th publish twice.
type doubling struct {
	outbox.Publisher
	n, at int
}

func (p *doubling) Publish(topic string, payload []byte) outbox.Token {
	if p.n++; p.n == p.at {
		p.Publisher.Publish(topic, payload)
	}
	return p.Publisher.Publish(topic, payload)
}

// swapping sends its at-th publish after the one after it. The fake
// acknowledges at once, so the held one's token is the late publish's.
type swapping struct {
	outbox.Publisher
	n, at int
	held  *late
}

type late struct {
	topic   string
	payload []byte
	done    chan struct{}
	err     error
}

func (l *late) Done() <-chan struct{} { return l.done }
func (l *late) Error() error          { return l.err }

func (p *swapping) Publish(topic string, payload []byte) outbox.Token {
	p.n++
	if p.n == p.at {
		p.held = &late{topic: topic, payload: payload, done: make(chan struct{})}
		return p.held
	}
	tok := p.Publisher.Publish(topic, payload)
	if h := p.held; h != nil {
		p.held = nil
		t := p.Publisher.Publish(h.topic, h.payload)
		<-t.Done()
		h.err = t.Error()
		close(h.done)
	}
	return tok
}

// leaking starts a goroutine with each connection that nothing ends.
type leaking struct {
	outbox.Publisher
	mu    sync.Mutex
	never chan struct{}
}

func (p *leaking) Connect(ctx context.Context) error {
	p.mu.Lock()
	if p.never == nil {
		p.never = make(chan struct{})
	}
	never := p.never
	p.mu.Unlock()
	go func() { <-never }()
	return p.Publisher.Connect(ctx)
}
