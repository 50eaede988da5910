package outboxtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// The relay's options in every case: a window small enough to fill with a
// few events, quick reconnections and retries, an acknowledgement timeout
// long enough never to end a connection the case did not cut, and a short
// shutdown.
const (
	window          = 16
	maxAttempts     = 2
	shutdownTimeout = 500 * time.Millisecond
	// shutdownMargin is how much longer than ShutdownTimeout Run may take
	// to return once cancelled: the marks, the lease's release and the
	// clock's store, under the race detector on a busy machine. It is
	// shorter than a broker's keepalive would take to end a connection
	// whose acknowledgements never come.
	shutdownMargin = time.Second
	// patience bounds every wait for something the relay or the broker
	// must do.
	patience = 30 * time.Second
	// stillness bounds a wait for events that have stopped arriving.
	stillness = 10 * time.Second
)

func relayOptions() outbox.RelayOptions {
	return outbox.RelayOptions{
		Source:          "/outboxtest",
		Window:          window,
		Reconnect:       outbox.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		Retry:           outbox.DefaultRetryPolicy{Backoff: outbox.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}, MaxAttempts: maxAttempts},
		AckTimeout:      10 * time.Second,
		LeaseTTL:        2 * time.Second,
		ShutdownTimeout: shutdownTimeout,
	}
}

// fixture is one case's world: a new outbox, the broker, a subscriber to
// it and the relays the case runs.
type fixture struct {
	t        *testing.T
	broker   Broker
	features Features
	ob       *outbox.Outbox
	got      *stream
}

func newFixture(t *testing.T, b Broker, f Features) *fixture {
	t.Helper()
	require.NotNil(t, b.Publisher, "Broker.Publisher is required")
	require.NotNil(t, b.Subscribe, "Broker.Subscribe is required")
	require.NotNil(t, b.Cut, "Broker.Cut is required")
	require.NotEmpty(t, b.Topic, "Broker.Topic is required")
	ob, err := outbox.Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"), outbox.Options{Logger: logger()})
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	x := &fixture{t: t, broker: b, features: f, ob: ob, got: newStream()}
	b.Subscribe(x.got.add)
	return x
}

// logger is quiet unless OUTBOX_TEST_LOG is set.
func logger() *slog.Logger {
	if os.Getenv("OUTBOX_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// commit commits n events to topic, one transaction each.
func (x *fixture) commit(topic string, n int) {
	x.t.Helper()
	for range n {
		require.NoError(x.t, x.commitOne(topic))
	}
}

func (x *fixture) commitOne(topic string) error {
	return x.ob.Transact(context.Background(), func(tx *sql.Tx) error {
		return x.ob.Enqueue(context.Background(), tx, outbox.Message{Topic: topic, Payload: []byte(`{"conformance":true}`)})
	})
}

var errRollBack = errors.New("outboxtest: rolled back on purpose")

// rollBack enqueues an event in a transaction that rolls back, and returns
// the event's id, which must never be published.
func (x *fixture) rollBack(topic string) string {
	x.t.Helper()
	id, err := x.tryRollBack(topic)
	require.NoError(x.t, err)
	return id
}

// tryRollBack is rollBack for another goroutine than the case's.
func (x *fixture) tryRollBack(topic string) (string, error) {
	id := outbox.NewID()
	err := x.ob.Transact(context.Background(), func(tx *sql.Tx) error {
		if err := x.ob.Enqueue(context.Background(), tx, outbox.Message{Topic: topic, ID: id, Payload: []byte(`{"rolled_back":true}`)}); err != nil {
			return err
		}
		return errRollBack
	})
	if !errors.Is(err, errRollBack) {
		return "", fmt.Errorf("a transaction meant to roll back: %w", err)
	}
	return id, nil
}

// row is one row of the outbox, as the cases check it.
type row struct {
	seq       int64
	id        string
	state     outbox.State
	attempts  int
	lastError string
}

// rows is every row of the outbox, in commit order.
func (x *fixture) rows() []row {
	x.t.Helper()
	rs, err := x.ob.DB().Query(`SELECT seq, id, state, attempts, coalesce(last_error, '') FROM outbox_messages ORDER BY seq`)
	require.NoError(x.t, err)
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		require.NoError(x.t, rs.Scan(&r.seq, &r.id, &r.state, &r.attempts, &r.lastError))
		out = append(out, r)
	}
	require.NoError(x.t, rs.Err())
	return out
}

// count is how many rows are in state.
func (x *fixture) count(state outbox.State) int {
	x.t.Helper()
	var n int
	require.NoError(x.t, x.ob.DB().QueryRow(`SELECT count(*) FROM outbox_messages WHERE state = ?`, state).Scan(&n))
	return n
}

// running is a relay running in the background.
type running struct {
	*outbox.Relay
	pub      outbox.Publisher
	cancel   context.CancelFunc
	done     chan error
	haltOnce sync.Once
	halted   time.Time
	stopOnce sync.Once
	took     time.Duration
}

// start runs a relay with a new Publisher until stop, or the case's end.
func (x *fixture) start(opts outbox.RelayOptions) *running {
	x.t.Helper()
	return x.startWith(x.broker.Publisher(), opts)
}

// startWith runs a relay with pub until stop, or the case's end.
func (x *fixture) startWith(pub outbox.Publisher, opts outbox.RelayOptions) *running {
	x.t.Helper()
	r, err := x.ob.NewRelay(pub, opts)
	require.NoError(x.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	rr := &running{Relay: r, pub: pub, cancel: cancel, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(ctx) }()
	x.t.Cleanup(func() { rr.stop(x.t) })
	return rr
}

// halt cancels Run's context, once.
func (rr *running) halt() {
	rr.haltOnce.Do(func() {
		rr.halted = time.Now()
		rr.cancel()
	})
}

// stop halts the relay and returns how long Run took to return after
// halt; it must return nil within patience.
func (rr *running) stop(t *testing.T) time.Duration {
	t.Helper()
	rr.halt()
	rr.stopOnce.Do(func() {
		select {
		case err := <-rr.done:
			rr.took = time.Since(rr.halted)
			if err != nil {
				t.Errorf("Relay.Run: %v", err)
			}
		case <-time.After(patience):
			rr.took = patience
			t.Errorf("Relay.Run did not return within %s of its cancellation", patience)
		}
	})
	return rr.took
}

// waitFor polls cond until it holds, and fails the case if it does not
// within d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", d, what)
		}
		time.Sleep(time.Millisecond) // polling, bounded by the deadline
	}
}

// holds reports whether cond holds throughout d, looking every millisecond:
// how a case sees that something does not happen.
func holds(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !cond() {
			return false
		}
		time.Sleep(time.Millisecond) // sampling, bounded by d
	}
	return cond()
}

// connected waits until rr has a connection and has published through it:
// an event committed now is delivered and marked sent, and nothing is in
// flight. The connection speaks Features.Protocol.
func (x *fixture) connected(rr *running) {
	x.t.Helper()
	base := x.got.unique()
	sent := x.count(outbox.StateSent)
	x.commit(x.broker.Topic, 1)
	waitFor(x.t, patience, "the relay to connect and deliver an event", func() bool {
		return x.got.unique() > base && x.count(outbox.StateSent) > sent && rr.Metrics().InFlight == 0
	})
	x.speaks(rr)
}

// speaks checks that rr's connection speaks Features.Protocol, if set.
func (x *fixture) speaks(rr *running) {
	x.t.Helper()
	if p := x.features.Protocol; p != "" {
		require.Equal(x.t, p, rr.Protocol(), "the protocol the relay's connection speaks")
	}
}

// effectiveWindow is the window the relay keeps on pub's connection: the
// broker's limit, where its WindowLimiter says a smaller one.
func effectiveWindow(pub outbox.Publisher, w int) int {
	if wl, ok := pub.(outbox.WindowLimiter); ok {
		if n := wl.MaxInFlight(); n > 0 && n < w {
			return n
		}
	}
	return w
}

// noneCharged checks that no attempt was charged against any message.
func (x *fixture) noneCharged(relays ...*running) {
	x.t.Helper()
	for _, rr := range relays {
		require.Zero(x.t, rr.Metrics().AttemptsCharged, "attempts charged by the isolation rule")
	}
	for _, r := range x.rows() {
		require.Zero(x.t, r.attempts, "seq %d charged %d attempts (%s)", r.seq, r.attempts, r.lastError)
	}
}

func (r row) String() string { return fmt.Sprintf("seq %d (%s, %s)", r.seq, r.id, r.state) }

// delivered waits until n events have arrived (see stream.waitFor).
func (x *fixture) delivered(n int, what string) {
	x.t.Helper()
	x.got.waitFor(x.t, n, what, x.rows)
}
