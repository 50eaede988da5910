package outbox

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/lease"
	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

const leaseChildEnv = "OUTBOX_LEASE_CHILD_DB"

// TestLeaseChild holds the lease of the database named by leaseChildEnv
// until it is killed; it does nothing otherwise.
func TestLeaseChild(t *testing.T) {
	path := os.Getenv(leaseChildEnv)
	if path == "" {
		t.Skip("the child of TestLeaseTakenAtOnceFromKilledHolder; runs only when started by it")
	}
	go func() { // an orphan must not run on
		bufio.NewReader(os.Stdin).ReadByte()
		os.Exit(3)
	}()
	ctx := context.Background()
	ob, err := Open(ctx, path, Options{Logger: testLogger()})
	if err != nil {
		os.Exit(2)
	}
	opts := fastRelay()
	opts.LeaseTTL = time.Hour
	opts.Owner = "child"
	r, err := ob.NewRelay(&fakePublisher{connErr: errors.New("no broker")}, opts)
	if err != nil {
		os.Exit(2)
	}
	go r.Run(ctx)
	for {
		st, err := ob.Stats(ctx)
		if err == nil && st.LeaseOwner == "child" {
			os.Stdout.WriteString("HOLDING\n")
			select {}
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLeaseTakenAtOnceFromKilledHolder: a relay restarted after a crash
// used to wait a whole LeaseTTL before it published, on every reboot of
// every till, because the dead holder's lease had to go stale first. A
// holder on this host whose process is gone (or whose boot is over) is
// provably dead: its lease is taken at once. A live one is waited for.
func TestLeaseTakenAtOnceFromKilledHolder(t *testing.T) {
	if lease.ThisHolder().BootID == "" {
		t.Skip("not Linux: no boot id, a holder is never judged dead")
	}
	if testing.Short() {
		t.Skip("re-executes the test binary (-short skips that, as under qemu-user)")
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "lease.db")
	ob := openTestPath(t, path, Options{})
	commitOrder(t, ob, "t", 1)

	child := exec.Command(os.Args[0], "-test.run=^TestLeaseChild$", "-test.count=1")
	child.Env = append(os.Environ(), leaseChildEnv+"="+path)
	stdin, err := child.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	stdout, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HOLDING\n", line)

	// While the child lives, its lease is not taken.
	conn, err := sqlconn.Open(ctx, ob.DB())
	require.NoError(t, err)
	defer conn.Close()
	defer conn.Close()
	require.Equal(t, "child", waitedFor(t, conn), "a live holder is waited for")

	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	child.Wait()

	pub := startLongLeaseRelay(t, ob)
	eventually(t, 10*time.Second, "the lease taken and the backlog published, long before a TTL", func() bool {
		return pub.publishedCount() == 1
	})
}

// TestLeaseTakenAtOnceAfterReboot: a lease left by a relay of an earlier
// boot of this host is taken at once.
func TestLeaseTakenAtOnceAfterReboot(t *testing.T) {
	self := lease.ThisHolder()
	if self.BootID == "" {
		t.Skip("not Linux: no boot id, a holder is never judged dead")
	}
	ob := openTest(t, Options{})
	commitOrder(t, ob, "t", 1)
	_, err := ob.DB().Exec(`INSERT INTO outbox_lease (name, owner, token, expires_at, host, machine_id, boot_id, pid, pid_start, pid_ns)
		VALUES ('relay', 'before-the-power-cut', 7, 0, ?, ?, 'an-earlier-boot', ?, ?, ?)`,
		self.Host, self.MachineID, self.PID, self.PIDStart, self.PIDNS)
	require.NoError(t, err)
	pub := startLongLeaseRelay(t, ob)
	eventually(t, 10*time.Second, "published, long before a TTL", func() bool { return pub.publishedCount() == 1 })

	// A holder on another host is waited for.
	ob2 := openTest(t, Options{})
	commitOrder(t, ob2, "t", 1)
	_, err = ob2.DB().Exec(`INSERT INTO outbox_lease (name, owner, token, expires_at, host, machine_id, boot_id, pid, pid_start, pid_ns)
		VALUES ('relay', 'elsewhere', 7, 0, 'another-host', 'another-machine', 'an-earlier-boot', 1, 1, ?)`, self.PIDNS)
	require.NoError(t, err)
	conn, err := sqlconn.Open(context.Background(), ob2.DB())
	require.NoError(t, err)
	defer conn.Close()
	require.Equal(t, "elsewhere", waitedFor(t, conn))
}

// waitedFor tries to take the relay lease of conn's database for a moment
// and returns the holder it found itself waiting for; it fails the test if
// the lease was taken.
func waitedFor(t *testing.T, conn *sqlconn.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var holder string
	err := lease.New(conn, "me", time.Hour, time.Now).Acquire(ctx, func(h string) { holder = h }, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the lease was taken")
	return holder
}

// startLongLeaseRelay starts a relay on ob, publishing to a fakePublisher,
// whose lease lasts an hour: what it publishes within a test, it did not
// wait a TTL for.
func startLongLeaseRelay(t *testing.T, ob *Outbox) *fakePublisher {
	t.Helper()
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.LeaseTTL = time.Hour
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	return pub
}

// leaseToken is the relay lease's token: it moves at every renewal.
func leaseToken(t testing.TB, ob *Outbox) int64 {
	t.Helper()
	_, token := leaseRow(t, ob)
	return token
}

// startContender starts a second relay on ob, with r's options but its own
// name, which waits for r's lease until the test ends.
func startContender(t *testing.T, ob *Outbox, r *Relay) {
	t.Helper()
	opts := r.opts
	opts.Owner = "contender"
	r2, err := ob.NewRelay(&fakePublisher{}, opts)
	require.NoError(t, err)
	startRelay(t, r2)
}

// leaseRow is the relay lease's holder and token.
func leaseRow(t testing.TB, ob *Outbox) (owner string, token int64) {
	t.Helper()
	require.NoError(t, ob.DB().QueryRow(`SELECT owner, token FROM outbox_lease WHERE name = 'relay'`).Scan(&owner, &token))
	return owner, token
}

// TestIdleRelayRenewsEveryHalfTTL: a relay connected and waiting for work
// renews its lease every half TTL, not every quarter, and still publishes
// at once, and a contender waiting all along never takes the lease.
func TestIdleRelayRenewsEveryHalfTTL(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.LeaseTTL = time.Second
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	skips := counted(&r.hooks.onSkip)
	startRelay(t, r)
	eventually(t, 5*time.Second, "connected", func() bool { return pub.connectCount() == 1 })
	startContender(t, ob, r)
	start, token := time.Now(), leaseToken(t, ob)
	eventually(t, 10*time.Second, "three seconds", func() bool { return time.Since(start) >= 3*time.Second })
	renewals := leaseToken(t, ob) - token
	t.Logf("%d renewals and %d skipped in %s", renewals, skips.Load(), time.Since(start).Round(time.Millisecond))
	// Every 500 ms: 6 in 3 s; every 250 ms (a busy relay's rate) would be 12.
	require.LessOrEqual(t, renewals, int64(9), "renewals in 3 s of an idle relay, TTL 1 s")
	require.GreaterOrEqual(t, renewals, int64(3), "renewals in 3 s of an idle relay, TTL 1 s")
	require.Positive(t, skips.Load())

	for i := 0; i < 5; i++ {
		commitOrder(t, ob, "orders", i)
		eventually(t, 5*time.Second, "published", func() bool { return pub.publishedCount() == i+1 })
	}
	require.Equal(t, r.opts.Owner, leaseOwner(t, ob), "the idle relay kept its lease")
}

// TestIdleRelayRenewsBeforeItPublishes: a relay whose lease lapsed while it
// waited for work asks for a renewal when a message comes, instead of
// waiting for the renewal timer (here a quarter hour away).
func TestIdleRelayRenewsBeforeItPublishes(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.LeaseTTL = time.Hour
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	leases := make(chan *lease.Lease, 1)
	r.hooks.onLease = func(l *lease.Lease) { leases <- l }
	startRelay(t, r)
	eventually(t, 5*time.Second, "connected", func() bool { return pub.connectCount() == 1 })
	l := <-leases
	commitOrder(t, ob, "orders", 0)
	eventually(t, 5*time.Second, "published", func() bool { return pub.publishedCount() == 1 })

	token := leaseToken(t, ob)
	l.Backdate(time.Now().Add(-40 * time.Minute)) // lapsed: past half the TTL
	require.False(t, l.Valid())
	commitOrder(t, ob, "orders", 1)
	eventually(t, 5*time.Second, "published after the lease lapsed", func() bool { return pub.publishedCount() == 2 })
	require.Equal(t, token+1, leaseToken(t, ob), "renewed once, before publishing")
	require.True(t, l.Valid())
}

// startParkedRelay starts a relay on ob that hears every commit (it
// watches the WAL, with a safety look well within half its TTL of 1 s) and
// waits until it is connected through fake and has skipped a renewal.
func startParkedRelay(t *testing.T, ob *Outbox, pub Publisher, fake *fakePublisher) (r *Relay, skips *atomic.Int64) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("inotify is Linux's")
	}
	opts := fastRelay()
	opts.LeaseTTL = time.Second
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	r.hooks.watch.SafetyPoll = 100 * time.Millisecond
	skips = counted(&r.hooks.onSkip)
	startRelay(t, r)
	eventually(t, 5*time.Second, "connected and skipping", func() bool { return fake.connectCount() == 1 && skips.Load() > 0 })
	return r, skips
}

// leaseOwner is the lease holder's name.
func leaseOwner(t testing.TB, ob *Outbox) string {
	t.Helper()
	owner, _ := leaseRow(t, ob)
	return owner
}

// TestIdleRelayThatHearsAllRenewsNot: a relay that watches its WAL, with a
// safety look well within half its TTL, renews nothing while it waits for
// work, and its outbox clock stands still meanwhile; a message then goes
// out at once, after one renewal.
func TestIdleRelayThatHearsAllRenewsNot(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{}
	_, skips := startParkedRelay(t, ob, pub, pub)
	start, token, tick := time.Now(), leaseToken(t, ob), ob.clock.Now()
	eventually(t, 10*time.Second, "three seconds", func() bool { return time.Since(start) >= 3*time.Second })
	renewals, ticked := leaseToken(t, ob)-token, ob.clock.Now()-tick
	t.Logf("%d renewals and %d skipped in %s; the clock moved %d ms", renewals, skips.Load(), time.Since(start).Round(time.Millisecond), ticked)
	require.Zero(t, renewals, "renewals in 3 s of an idle relay")
	require.Less(t, ticked, int64(500), "the outbox clock, in ms, in 3 s of an idle relay")

	commitOrder(t, ob, "orders", 0)
	eventually(t, 5*time.Second, "published", func() bool { return pub.publishedCount() == 1 })
	require.Equal(t, token+1, leaseToken(t, ob), "renewed once, before publishing")
}

// TestIdleRelayThatHearsAllKeepsItsLease: a contender announces itself
// before it counts an idle holder's silence, and the holder, which renews
// nothing on its own while idle, renews when it hears that: the contender
// never takes the lease, and the holder still publishes.
func TestIdleRelayThatHearsAllKeepsItsLease(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{}
	r, _ := startParkedRelay(t, ob, pub, pub)
	startContender(t, ob, r)
	start, token := time.Now(), leaseToken(t, ob)
	eventually(t, 10*time.Second, "four seconds", func() bool { return time.Since(start) >= 4*time.Second })
	renewals := leaseToken(t, ob) - token
	var announcements int64
	require.NoError(t, ob.DB().QueryRow(`SELECT token FROM outbox_lease WHERE name = 'relay.waiting'`).Scan(&announcements))
	t.Logf("%d renewals, %d announcements in %s", renewals, announcements, time.Since(start).Round(time.Millisecond))
	// An announcement every half TTL, and a renewal for each.
	require.GreaterOrEqual(t, renewals, int64(4), "renewals in 4 s of an idle relay with a contender, TTL 1 s")
	require.LessOrEqual(t, renewals, int64(12), "renewals in 4 s of an idle relay with a contender, TTL 1 s")

	commitOrder(t, ob, "orders", 0)
	eventually(t, 5*time.Second, "published", func() bool { return pub.publishedCount() == 1 })
	require.Equal(t, r.opts.Owner, leaseOwner(t, ob), "the idle relay kept its lease")
}

// losingPublisher is a fakePublisher whose connection can drop while idle
// (connectionLoser), and then refuses to connect.
type losingPublisher struct {
	*fakePublisher
	mu   sync.Mutex
	lost chan struct{}
}

func (p *losingPublisher) Connect(ctx context.Context) error {
	if err := p.fakePublisher.Connect(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lost = make(chan struct{})
	return nil
}

func (p *losingPublisher) ConnectionLost() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

func (p *losingPublisher) drop() {
	p.fakePublisher.mu.Lock()
	p.fakePublisher.connErr = errors.New("connection refused")
	p.fakePublisher.mu.Unlock()
	p.fakePublisher.Disconnect()
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.lost)
}

// TestIdleRelayThatHearsAllRenewsWhileDisconnected: an idle relay that
// stopped renewing goes back to renewing, every quarter TTL, when its
// connection drops, and keeps its lease through the outage.
func TestIdleRelayThatHearsAllRenewsWhileDisconnected(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &losingPublisher{fakePublisher: &fakePublisher{}}
	r, _ := startParkedRelay(t, ob, pub, pub.fakePublisher)
	token := leaseToken(t, ob)
	pub.drop()
	eventually(t, 5*time.Second, "reconnecting", func() bool { return pub.connectCount() >= 3 })
	start := time.Now()
	eventually(t, 10*time.Second, "three seconds", func() bool { return time.Since(start) >= 3*time.Second })
	renewals := leaseToken(t, ob) - token
	t.Logf("%d renewals in %s, disconnected", renewals, time.Since(start).Round(time.Millisecond))
	require.GreaterOrEqual(t, renewals, int64(6), "renewals in 3 s of a disconnected relay, TTL 1 s: every quarter TTL")
	require.Equal(t, r.opts.Owner, leaseOwner(t, ob))
}

// TestRenewalTakesTheWriteLockInAGap: another connection holds the write
// lock for 90 ms at a time and lets it go for about a millisecond; a
// renewal still gets in within a few of those gaps, because it polls for
// the lock as a mark does. In SQLite's busy handler, whose sleeps grow to
// 100 ms, it mostly missed them: a renewal waiting there held the relay's
// connection, and its marks, for seconds.
func TestRenewalTakesTheWriteLockInAGap(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.LeaseTTL = time.Hour // no renewal of its own meanwhile
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	leases := make(chan *lease.Lease, 1)
	r.hooks.onLease = func(l *lease.Lease) { leases <- l }
	startRelay(t, r)
	l := <-leases

	locked := holdWriteLockInBursts(t, dbPath(t, ob), 90*time.Millisecond)
	for i := 0; i < 5; i++ {
		locked()
		start := time.Now()
		var also func(context.Context, sqlconn.Prepared) error
		if i%2 == 1 {
			// The renewal's own transaction, BEGIN IMMEDIATE.
			also = func(ctx context.Context, p sqlconn.Prepared) error { return ob.storeClock(ctx, p) }
		}
		alsoErr, err := l.Renew(context.Background(), also)
		took := time.Since(start)
		t.Logf("renewal %d took %s", i, took.Round(time.Millisecond))
		require.NoError(t, err)
		require.NoError(t, alsoErr)
		require.Less(t, took, 3*time.Second, "a renewal against a writer that lets the lock go for a millisecond every 90 ms")
	}
}

// holdWriteLockInBursts holds the write lock of the database at path on a
// connection of its own, hold at a time with about a millisecond between,
// until the test ends. The function returned waits until the lock has
// been taken again.
func holdWriteLockInBursts(t *testing.T, path string, hold time.Duration) (locked func()) {
	t.Helper()
	writer, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	require.NoError(t, err)
	wc, err := writer.Conn(context.Background())
	require.NoError(t, err)
	stop := make(chan struct{})
	took := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := wc.ExecContext(context.Background(), `BEGIN IMMEDIATE`); err != nil {
				t.Error(err)
				return
			}
			select {
			case took <- struct{}{}:
			default:
			}
			time.Sleep(hold)
			wc.ExecContext(context.Background(), `ROLLBACK`)
			time.Sleep(time.Millisecond)
		}
	}()
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		wc.Close()
		writer.Close()
	})
	return func() {
		select {
		case <-took: // an old one
		default:
		}
		<-took
	}
}

// TestStateWritesNeedTheLease: relay A has message 1 in its hands when it
// stops (SIGSTOP, a frozen VM) for longer than its lease; relay B takes the
// lease over and sends, or has message 1 in flight. When A's outcome for
// message 1 then arrives — refused for good, refused, acknowledged, or its
// expiry run out at its turn — A's write must change nothing, and A stops
// with ErrLeaseLost.
func TestStateWritesNeedTheLease(t *testing.T) {
	undeliverable := fmt.Errorf("%w: %w: not authorized (0x87)", ErrRejected, ErrUndeliverable)
	rejected := fmt.Errorf("%w: quota exceeded (0x97)", ErrRejected)
	for _, tc := range []struct {
		name    string
		bSends  bool  // B delivers message 1 before A's outcome arrives; else B holds it in flight
		outcome error // A's publish completes with it (nil: acknowledged)
		expire  bool  // instead, message 1 expires before A's turn
	}{
		{"refused for good after B sent it", true, undeliverable, false},
		{"refused while B has it in flight", false, rejected, false},
		{"acknowledged while B has it in flight", false, nil, false},
		{"expired at A's turn after B sent it", true, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) { testStateWritesNeedTheLease(t, tc.bSends, tc.outcome, tc.expire) })
	}
}

func testStateWritesNeedTheLease(t *testing.T, bSends bool, outcome error, expire bool) {
	ctx := context.Background()
	el := &harness.FakeElapsed{} // A's clock: the expiry runs out for A only
	ob := openTest(t, Options{elapsed: el.Elapsed})
	enqueueExpiring(t, ob, "t", 1, time.Hour)
	commitOrder(t, ob, "t", 2)

	pubA := &fakePublisher{hold: true}
	optsA := fastRelay()
	// The lease and the acknowledgement outlast the test: A notices its
	// loss only by the write under test.
	optsA.Owner, optsA.LeaseTTL, optsA.AckTimeout, optsA.Window = "A", time.Minute, time.Minute, 1
	optsA.ShutdownTimeout = 100 * time.Millisecond
	rA, err := ob.NewRelay(pubA, optsA)
	require.NoError(t, err)
	atTurn, goOn := make(chan struct{}), make(chan struct{})
	var once sync.Once
	if expire {
		rA.hooks.beforeHandOff = func(seq int64) {
			if seq == 1 {
				once.Do(func() { close(atTurn) })
				<-goOn
			}
		}
	}
	actx, cancelA := context.WithCancel(ctx)
	errA := make(chan error, 1)
	go func() { errA <- rA.Run(actx) }()
	aDone := false
	t.Cleanup(func() {
		cancelA()
		if expire {
			select {
			case <-goOn:
			default:
				close(goOn)
			}
		}
		if !aDone {
			<-errA
		}
	})
	if expire {
		<-atTurn
	} else {
		eventually(t, 5*time.Second, "message 1 in A's hands", func() bool { return pubA.heldCount() == 1 })
	}

	// A is stopped past its lease: B, in another process, takes it over.
	_, err = ob.DB().Exec(`UPDATE outbox_lease SET owner = '' WHERE name = 'relay'`)
	require.NoError(t, err)
	obB, err := Open(ctx, ob.path, Options{Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { obB.Close() })
	pubB := &fakePublisher{hold: !bSends}
	optsB := fastRelay()
	optsB.Owner, optsB.AckTimeout, optsB.ShutdownTimeout = "B", time.Minute, 100*time.Millisecond
	rB, err := obB.NewRelay(pubB, optsB)
	require.NoError(t, err)
	startRelay(t, rB)
	if bSends {
		eventually(t, 5*time.Second, "B sent both", func() bool { return countState(t, ob, "sent") == 2 })
	} else {
		eventually(t, 5*time.Second, "message 1 in B's hands", func() bool { return pubB.heldCount() >= 1 })
	}
	before := relayState(t, ob)

	// A wakes to its outcome. (What A publishes after it is acknowledged
	// at once.)
	pubA.mu.Lock()
	pubA.hold = false
	pubA.mu.Unlock()
	if expire {
		el.Advance(2 * time.Hour)
		close(goOn)
	} else if outcome == nil {
		pubA.release(1)
	} else {
		pubA.fail(outcome)
	}
	eventually(t, 5*time.Second, "A stopped, or wrote", func() bool {
		select {
		case err = <-errA:
			aDone = true
			return true
		default:
			return relayState(t, ob) != before
		}
	})
	require.Equal(t, before, relayState(t, ob), "A wrote without its lease")
	if !aDone {
		select {
		case err = <-errA:
			aDone = true
		case <-time.After(5 * time.Second):
			t.Fatal("A did not stop")
		}
	}
	require.ErrorIs(t, err, ErrLeaseLost)

	if !bSends {
		pubB.mu.Lock()
		pubB.hold = false
		pubB.mu.Unlock()
		pubB.release(2)
		eventually(t, 5*time.Second, "B sent both", func() bool { return countState(t, ob, "sent") == 2 })
	}
	rows, err := ob.DB().Query(`SELECT seq, attempts FROM outbox_messages ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var seq, attempts int64
		require.NoError(t, rows.Scan(&seq, &attempts))
		require.Zero(t, attempts, "message %d charged", seq)
	}
	require.NoError(t, rows.Err())
}

// relayState is what the relay's state writes change: the mark, and each
// row's attempts, error, dead_at and expired.
func relayState(t *testing.T, ob *Outbox) string {
	t.Helper()
	var s string
	require.NoError(t, ob.DB().QueryRow(`SELECT (SELECT sent_seq FROM outbox_state WHERE id = 1) || ';' ||
		coalesce((SELECT group_concat(seq || ',' || attempts || ',' || coalesce(last_error, '') || ',' ||
			coalesce(dead_at, '') || ',' || expired, ';') FROM outbox), '')`).Scan(&s))
	return s
}
