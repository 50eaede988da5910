package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/lease"
	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// testLogger keeps test output quiet unless OUTBOX_TEST_LOG is set.
func testLogger() *slog.Logger { return harness.TestLogger() }

func openTest(t testing.TB, opts Options) *Outbox {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger()
	}
	ob, err := Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"), opts)
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	_, err = ob.DB().Exec(`CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	require.NoError(t, err)
	return ob
}

// commitOrder writes a business row and its event in one transaction.
func commitOrder(t testing.TB, ob *Outbox, topic string, n int) {
	t.Helper()
	err := ob.Transact(context.Background(), func(tx *sql.Tx) error {
		if _, err := tx.Exec(`INSERT INTO orders (item) VALUES (?)`, fmt.Sprint("item-", n)); err != nil {
			return err
		}
		return ob.Enqueue(context.Background(), tx, Message{Topic: topic, Payload: fmt.Appendf(nil, `{"n":%d}`, n)})
	})
	require.NoError(t, err)
}

// fastRelay returns relay options that make tests quick: short backoffs and
// timeouts.
func fastRelay() RelayOptions {
	return RelayOptions{
		Source:          "/test/device",
		Reconnect:       Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		Retry:           fastRetry(0),
		AckTimeout:      2 * time.Second,
		LeaseTTL:        2 * time.Second,
		ShutdownTimeout: 2 * time.Second,
	}
}

// fastRetry is the retry policy of fastRelay with maxAttempts (0: the
// default).
func fastRetry(maxAttempts int) RetryPolicy {
	return DefaultRetryPolicy{Backoff: Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}, MaxAttempts: maxAttempts}
}

// startRelay runs r until the test ends and checks that Run returned nil.
func startRelay(t testing.TB, r *Relay) (stop func()) {
	t.Helper()
	return harness.RunInBackground(t, "relay", r)
}

// eventually waits for cond, polling, and fails the test at the deadline.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	harness.Eventually(t, timeout, what, cond)
}

// eventIDSeq reads an event's id and sequence for a harness.EventLog.
func eventIDSeq(payload []byte) (string, int64, error) {
	ev, err := DecodeEvent(payload)
	return ev.ID, ev.Sequence, err
}

// startPersistentSubscriber connects a persistent-session QoS 1 subscriber
// to addr (the broker itself, never through a proxy) and keeps it
// connected until the test ends.
func startPersistentSubscriber(t testing.TB, addr, clientID, filter string) *harness.Subscriber {
	t.Helper()
	return harness.StartSubscriber(t, addr, harness.SubscriberOptions{ClientID: clientID, Filter: filter}, eventIDSeq)
}

// delivery is one message as the broker routed it, its event decoded.
type delivery struct {
	topic   string
	payload []byte
	ev      Event
	evErr   error
}

func decodeDelivery(m harness.Message) delivery {
	d := delivery{topic: m.Topic, payload: m.Payload}
	d.ev, d.evErr = DecodeEvent(d.payload)
	return d
}

// recorder records every message the broker routes to it.
type recorder = harness.Recorder[delivery]

// firstDeliveries returns the sequence numbers in order of first delivery,
// and how many deliveries were duplicates.
func firstDeliveries(r *recorder) (seqs []int64, dups int) {
	seen := map[string]bool{}
	for _, d := range r.All() {
		if seen[d.ev.ID] {
			dups++
			continue
		}
		seen[d.ev.ID] = true
		seqs = append(seqs, d.ev.Sequence)
	}
	return seqs, dups
}

// broker is an in-process mochi broker on a free loopback port that
// refuses publishes to topics under "denied/", as an ACL would (mochi
// closes the connection, as an MQTT 3.1.1 broker does), with a recorder
// subscribed to every topic.
type broker struct {
	srv  *mochi.Server
	addr string
	rec  *recorder
}

func startBroker(t testing.TB) *broker {
	t.Helper()
	m := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{&harness.DenyPublish{Prefix: "denied/"}}})
	rec, err := harness.Record(m, "#", decodeDelivery)
	require.NoError(t, err)
	return &broker{srv: m.Server(), addr: m.Addr(), rec: rec}
}

func (b *broker) url() string { return "tcp://" + b.addr }

// fakePublisher is a Publisher under the test's control.
type fakePublisher struct {
	mu        sync.Mutex
	connected bool
	connErr   error                      // Connect fails with it while set
	reject    func(topic string) error   // per-message failure
	refuse    func(payload []byte) error // per-message failure, by what it carries
	hold      bool                       // tokens wait until release
	held      []*fakeToken
	published []string // payloads, in publish order
	connects  int
}

type fakeToken struct {
	done chan struct{}
	err  error
	once sync.Once
}

func (t *fakeToken) Done() <-chan struct{} { return t.done }
func (t *fakeToken) Error() error          { return t.err }
func (t *fakeToken) complete(err error) {
	t.once.Do(func() { t.err = err; close(t.done) })
}

func (p *fakePublisher) Connect(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.connects++
	if p.connErr != nil {
		return p.connErr
	}
	p.connected = true
	return nil
}

func (p *fakePublisher) Publish(topic string, payload []byte) Token {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := &fakeToken{done: make(chan struct{})}
	if !p.connected {
		t.complete(ErrNotConnected)
		return t
	}
	if p.reject != nil {
		if err := p.reject(topic); err != nil {
			t.complete(err)
			return t
		}
	}
	if p.refuse != nil {
		if err := p.refuse(payload); err != nil {
			t.complete(err)
			return t
		}
	}
	p.published = append(p.published, string(payload))
	if p.hold {
		p.held = append(p.held, t)
		return t
	}
	t.complete(nil)
	return t
}

func (p *fakePublisher) Disconnect() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.connected = false
	for _, t := range p.held {
		t.complete(errors.New("connection closed"))
	}
	p.held = nil
}

// release acknowledges the first n held publishes.
func (p *fakePublisher) release(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < n && len(p.held) > 0; i++ {
		p.held[0].complete(nil)
		p.held = p.held[1:]
	}
}

// fail completes the first held publish with err.
func (p *fakePublisher) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.held) > 0 {
		p.held[0].complete(err)
		p.held = p.held[1:]
	}
}

func (p *fakePublisher) heldCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

func (p *fakePublisher) connectCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.connects
}

func (p *fakePublisher) publishedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.published)
}

// rowState returns the state of the row with the given sequence number.
func rowState(t testing.TB, ob *Outbox, seq int64) (state string, attempts int) {
	t.Helper()
	require.NoError(t, ob.DB().QueryRow(`SELECT state, attempts FROM outbox_messages WHERE seq = ?`, seq).Scan(&state, &attempts))
	return state, attempts
}

func countState(t testing.TB, ob *Outbox, state string) int {
	t.Helper()
	var n int
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox_messages WHERE state = ?`, state).Scan(&n))
	return n
}

// outboxSeqs is every row's seq, in order.
func outboxSeqs(t *testing.T, db *sql.DB) []int64 {
	t.Helper()
	rows, err := db.Query(`SELECT seq FROM outbox ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	var seqs []int64
	for rows.Next() {
		var s int64
		require.NoError(t, rows.Scan(&s))
		seqs = append(seqs, s)
	}
	require.NoError(t, rows.Err())
	return seqs
}

// holdLease takes r's lease on rc, as Run does, for a test that calls the
// relay's state writes (which check it in SQL) without Run.
func holdLease(t testing.TB, r *Relay, rc *sqlconn.Conn) {
	t.Helper()
	l := lease.New(rc, r.opts.Owner, r.opts.LeaseTTL, r.ob.now)
	require.NoError(t, l.Acquire(context.Background(), nil, nil))
	r.lease = l
}

// counted sets *hook to count its calls, and returns the count.
func counted(hook *func()) *atomic.Int64 {
	n := new(atomic.Int64)
	*hook = func() { n.Add(1) }
	return n
}
