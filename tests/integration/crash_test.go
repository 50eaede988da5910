package integration

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeoutbox/outbox/compression"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// The crash test: a child process (this test binary, running
// TestCrashChild) commits orders with their events and relays them, over a
// link with 20 ms of latency, to a broker in the parent; the parent kills it
// with SIGKILL at random moments, over and over, and checks the file after
// every kill. Then a relay in the parent drains what is left, and the test
// checks the promises: nothing committed is lost, nothing rolled back is
// published, first deliveries come in commit order, a crash duplicates at
// most the window, nothing is dead or charged.
//
//	OUTBOX_CRASH_CYCLES=2000 go test -race -run TestCrashKill9 -v .  # a long run (default 30 kills)
//	OUTBOX_CRASH_SEED=12345 ...                                      # the same delays again
//	OUTBOX_TEST_LOG=1 ...                                            # the children's logs too

const (
	// crashEnvChild carries a child's orders (ordersChild): set, TestCrashChild
	// runs them.
	crashEnvChild = "OUTBOX_CRASH_CHILD"

	crashTopic    = "crash/orders" // a batched child's first topic of crashTopics
	crashSource   = "/crash/till"
	crashWindow   = 32
	crashRead     = 64 // RelayOptions.ReadSize
	crashLeaseTTL = 500 * time.Millisecond
	// Every crashRollbackEvery-th transaction of a child rolls back.
	crashRollbackEvery = 5
	// A commit every crashCommitEvery at most: orders arrive fast, yet
	// the backlog does not grow without bound over thousands of cycles,
	// while each child still leaves a backlog behind for the next one (a
	// killed child's lease is taken at once, its process being gone, but
	// the next one starts and connects first). Much faster (one fsync'd
	// commit after another) and the writer starves the relay's own writes
	// of the lock; no till works like that.
	crashCommitEvery = 8 * time.Millisecond
	// crashLinkDelay is the latency from a child to the broker: publishes
	// still on the wire when the child dies are lost with it, as a device
	// that loses power loses what it had not yet sent.
	crashLinkDelay = 20 * time.Millisecond
	// crashBatchEvents is the most events in one MQTT message of a
	// batched run (RelayOptions.Batch.MaxEvents).
	crashBatchEvents = 16
	// crashBacklog is the orders of mixed priorities a run of them
	// commits before its first child (commitBacklog).
	crashBacklog = 40
)

// crashTopics are the topics of a batched child's events: batches hold one
// topic each, so order is checked per topic, and a batch of one topic may
// overtake an earlier event of another.
var crashTopics = []string{crashTopic, "crash/refunds", "crash/voids"}

// crashRelayOptions make every phase happen often: purges every 20 ms of
// rows sent 50 ms ago (and with them incremental vacuum), small read
// batches, a short lease (in case a killed child's lease is not judged dead,
// as off Linux, it blocks the next one for a TTL), fast reconnects.
// batched adds batches of up to crashBatchEvents, compressed with zstd.
func crashRelayOptions(owner string, batched bool) outbox.RelayOptions {
	o := outbox.RelayOptions{
		Source:          crashSource,
		Window:          crashWindow,
		ReadSize:        crashRead,
		AckTimeout:      10 * time.Second, // nothing here withholds a PUBACK: only a stall would
		Reconnect:       outbox.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
		Retry:           outbox.DefaultRetryPolicy{Backoff: outbox.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}},
		Retention:       50 * time.Millisecond,
		PurgeInterval:   20 * time.Millisecond,
		LeaseTTL:        crashLeaseTTL,
		ShutdownTimeout: time.Second,
		Owner:           owner,
	}
	if batched {
		o.Batch = outbox.BatchOptions{MaxEvents: crashBatchEvents}
		o.Compress = compression.Zstd()
	}
	return o
}

func crashMQTTOptions(brokerURL, clientID string, proto outbox.MQTTProtocol) outbox.MQTTOptions {
	return outbox.MQTTOptions{Broker: brokerURL, ClientID: clientID, ConnectTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second, KeepAlive: 5 * time.Second, PingTimeout: 5 * time.Second, Protocol: proto}
}

// childProtocol alternates the MQTT versions from child to child.
func childProtocol(n int) outbox.MQTTProtocol {
	return []outbox.MQTTProtocol{outbox.Protocol5, outbox.Protocol311}[n%2]
}

// crashPayload is the event data: the event's own id, topic and priority
// (so a delivery can be checked against its envelope, the message that
// carried it and its order) and padding of a random size, up to more than a page, so
// purges free pages for incremental vacuum and some rows use overflow
// pages.
type crashPayload struct {
	ID       string `json:"id"`
	Topic    string `json:"topic"`
	Priority int    `json:"priority,omitempty"`
	Pad      string `json:"pad"`
}

var errCrashRollback = errors.New("rolled back on purpose")

// TestCrashChild is the process that gets killed. It does nothing unless
// TestCrashKill9 started it.
func TestCrashChild(t *testing.T) {
	runOrdersChild(t, crashEnvChild, "the child of TestCrashKill9; runs only when started by it")
}

// crashDelivery is one event the broker routed, with the message's topic
// and the client that published it (which child, or the final relay).
type crashDelivery struct {
	origin string
	topic  string
	ev     outbox.Event
	evErr  error
}

// crashInspect opens the database read-only after a crash, as it was left
// (see openReadOnly), and checks it.
func crashInspect(t *testing.T, path string) (orders, pending int) {
	t.Helper()
	db := openReadOnly(t, path)
	defer db.Close()
	harness.CheckIntegrity(t, db)
	// The pending bytes and skipped numbers kept by triggers and marks
	// (while the limits are set) agree with the rows, as the killed child
	// left them: the next child's Open would count them again.
	harness.CheckPendingCounters(t, db)
	var wantCount int64
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM outbox_messages WHERE state = 'pending'`).Scan(&wantCount))
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM orders`).Scan(&orders))
	return orders, int(wantCount)
}

func crashEnvInt(t *testing.T, name string, def uint64) uint64 {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.ParseUint(s, 10, 64)
	require.NoError(t, err, "%s", name)
	return v
}

// startCrashLink starts the link from the children to the broker: a proxy
// with crashLinkDelay of latency one way, so that what a child sent within
// the last delay is still on the wire and is lost if the child dies (its
// connection closes). Without it, every byte a killed child had written
// would still reach the in-process broker, and a relay that marked rows
// sent before their PUBACK would hardly ever be caught.
func startCrashLink(t *testing.T, broker string) *harness.FaultProxy {
	p := harness.StartFaultProxy(t, broker)
	p.SetLatency(harness.ToBroker, crashLinkDelay)
	return p
}

// crashRun is the parent's side of the crash test.
type crashRun struct {
	t        *testing.T
	b        *harness.Mochi
	link     *harness.FaultProxy // between the children and the broker, with latency
	rng      *rand.Rand
	path     string // the database
	sidePath string // rolled-back event ids, one a line
	batched  bool   // the children batch and compress (ordersChild.Batched)
	prios    bool   // the children commit mixed priorities (ordersChild.Priorities)

	early, relayed int // kills before the relay connected, and after
	// lost counts, per client, connections its relay lost while it ran:
	// nothing here cuts them, but an overloaded machine may miss a
	// keepalive, and each lost connection may duplicate a window too.
	lost map[string]int
}

// crashLostConn is what a relay logs when its connection fails.
const crashLostConn = "outbox relay connection lost"

// cycle starts a child, kills it with SIGKILL after a random delay, and
// checks the file it leaves behind.
func (c *crashRun) cycle(n int, verbose bool) (orders, pending int) {
	t := c.t
	client := fmt.Sprintf("crash-child-%d", n)
	child := startKilledChild(t, fmt.Sprintf("child %d", n), "TestCrashChild", crashEnvChild, ordersChild{
		DB: c.path, Broker: c.link.URL(), Client: client, RolledBack: c.sidePath, Seed: c.rng.Uint64(), Protocol: childProtocol(n), Batched: c.batched, Priorities: c.prios})
	defer child.done(verbose)

	// Most kills land while the child relays: the random delay starts once
	// its relay holds the lease and has connected. The others land at any
	// moment from its start: while it starts, opens and recovers the file,
	// commits, and waits for the dead child's lease.
	var delay time.Duration
	if c.rng.IntN(6) == 0 {
		c.early++
		delay = time.Duration(c.rng.IntN(400)) * time.Millisecond
	} else {
		c.relayed++
		delay = time.Duration(30+c.rng.IntN(371)) * time.Millisecond
		child.waitConnected(c.b, client)
	}
	child.runFor(delay)
	c.lost[client] += child.kill()
	return crashInspect(t, c.path)
}

// TestCrashKill9 kills a writing, relaying process with SIGKILL at random
// moments, many times, then lets a relay finish and checks every promise.
func TestCrashKill9(t *testing.T) {
	testCrashKill9(t, 30, false, false)
}

// TestCrashKill9Batched is TestCrashKill9 with batches of up to
// crashBatchEvents events, compressed with zstd, over three topics: the
// same promises per event, first deliveries in commit order per topic, a
// crash duplicating at most the bound's messages of crashBatchEvents each.
// OUTBOX_CRASH_CYCLES sets its cycles too.
func TestCrashKill9Batched(t *testing.T) {
	testCrashKill9(t, 10, true, false)
}

// TestCrashKill9Priorities is TestCrashKill9 with each event of priority
// 0, 5 or 9 (crashPriorities), after a backlog of them (commitBacklog):
// the same promises per event, first deliveries in commit order within
// each priority, and a backlog sent highest priority first (some events
// overtake). OUTBOX_CRASH_CYCLES sets its cycles too.
func TestCrashKill9Priorities(t *testing.T) {
	testCrashKill9(t, 10, false, true)
}

func testCrashKill9(t *testing.T, defaultCycles uint64, batched, prios bool) {
	if testing.Short() {
		t.Skip("-short: the crash test re-executes the test binary (not possible under qemu-user)")
	}
	cycles := int(crashEnvInt(t, "OUTBOX_CRASH_CYCLES", defaultCycles))
	require.Positive(t, cycles, "OUTBOX_CRASH_CYCLES")
	seed := crashEnvInt(t, "OUTBOX_CRASH_SEED", uint64(time.Now().UnixNano()))
	t.Logf("crash test: %d cycles, seed %d (OUTBOX_CRASH_SEED=%d replays the same delays), batched %v, priorities %v", cycles, seed, seed, batched, prios)
	began := time.Now()

	b := harness.StartMochi(t, harness.MochiOptions{})
	rec := recordEvents(t, b)

	dir := t.TempDir()
	run := &crashRun{
		t: t, b: b, link: startCrashLink(t, b.Addr()),
		rng:      rand.New(rand.NewPCG(seed, 0)),
		lost:     map[string]int{},
		path:     filepath.Join(dir, "till.db"),
		sidePath: filepath.Join(dir, "rolledback.txt"),
		batched:  batched,
		prios:    prios,
	}
	createOrders(t, run.path)
	if prios {
		commitBacklog(t, run.path, crashBacklog)
	}

	childLog := os.Getenv("OUTBOX_TEST_LOG") != ""
	var backlog int // pending after the last kill
	for n := 1; n <= cycles; n++ {
		orders, pending := run.cycle(n, childLog)
		backlog = pending
		if testing.Verbose() && (n%10 == 0 || n == cycles) {
			t.Logf("  after kill %d: %d orders committed, %d events pending, %d deliveries so far", n, orders, pending, len(rec.events()))
		}
	}
	killing := time.Since(began)

	// Let one relay finish the job, in this process, until nothing is
	// pending and the broker has routed every committed event.
	ob, stop, finalLog := drainRest(t, run.path, outbox.SyncFull, b.URL(), "crash-final", backlog, batched)
	drained := time.Since(began) - killing

	// What was committed, in commit order, and what was rolled back.
	committed := readOrders(t, ob.DB())
	rolledBack := readRolledBack(t, run.sidePath, committed)
	if missing := undelivered(rec, committed); len(missing) > 0 {
		t.Fatalf("LOST: %d of %d committed events never delivered, e.g. %s (order %d, committed by %s)",
			len(missing), len(committed), missing[0], committed[missing[0]].rowid, committed[missing[0]].client)
	}
	stop()
	run.lost["crash-final"] += strings.Count(finalLog.String(), crashLostConn)

	// Every delivery: well formed, committed, never rolled back; first
	// deliveries in commit order (per topic and priority: an unbatched run
	// has one topic, a run without priorities one priority).
	deliveries := rec.events()
	chk := checkDeliveries(deliveries, committed, rolledBack)
	require.NoError(t, chk.bad)
	require.Empty(t, chk.rolledBackSent, "rolled-back events were published")
	require.Empty(t, chk.phantoms(), "phantom")
	require.Zero(t, chk.seqChanged, "duplicates must carry their event's sequence")
	require.Empty(t, chk.disorder, "first deliveries out of commit order")
	first, dups, dupsBy := chk.first, chk.dups, chk.dupsBy
	maxDups, maxBy := chk.mostDups()
	lostConns := 0
	for _, n := range run.lost {
		lostConns += n
	}
	dead, pending := countState(t, ob, "dead"), countState(t, ob, "pending")
	var attempts int
	require.NoError(t, ob.DB().QueryRow(`SELECT coalesce(max(attempts), 0) FROM outbox`).Scan(&attempts))

	// A crash duplicates what was in flight and what was acknowledged but
	// not yet recorded; a lost connection only what was in flight.
	// The bound docs/guarantees.md gives: Window + max(Window, 256)
	// messages, each of up to MaxEvents events when batched.
	perMsg := 1
	if batched {
		perMsg = crashBatchEvents
	}
	perKill, perLost := (crashWindow+max(crashWindow, 256))*perMsg, crashWindow*perMsg
	shape := rec.shape("crash-final")
	t.Logf("crash test figures (seed %d, window %d, batched %v):", seed, crashWindow, batched)
	t.Logf("  kill -9 cycles            %7d  (%d while relaying, 30-400 ms after it connected; %d at 0-400 ms after start)", cycles, run.relayed, run.early)
	t.Logf("  integrity_check           %7s  after every kill", "ok")
	t.Logf("  orders committed          %7d", len(committed))
	t.Logf("  orders rolled back        %7d  delivered: 0", len(rolledBack))
	t.Logf("  events delivered, unique  %7d  of %d committed; first deliveries in commit order per topic and priority", len(first), len(committed))
	t.Logf("  overtaking                %7d  first deliveries after one of an event of their topic committed later (a higher priority's)", chk.overtook)
	t.Logf("  deliveries in all         %7d", len(deliveries))
	t.Logf("  MQTT messages             %7d  %s", shape.messages, shape)
	t.Logf("  duplicates                %7d  total, bound kills x %d + connections lost x %d = %d", dups, perKill, perLost, perKill*cycles+perLost*lostConns)
	t.Logf("  duplicates after one kill %7d  at most (sent again by %s), bound (window + mark slots) x events a message = %d", maxDups, maxBy, perKill)
	t.Logf("  dead / pending / charged  %3d / %d / %d", dead, pending, attempts)
	t.Logf("  connections lost          %7d  (none is caused on purpose; each may add a window of duplicates)", lostConns)
	t.Logf("  final drain               %7d  pending after the last kill, drained in %s", backlog, drained.Round(100*time.Millisecond))
	t.Logf("  time                      %7s  killing, %s in all", killing.Round(100*time.Millisecond), time.Since(began).Round(100*time.Millisecond))

	require.Equal(t, len(committed), len(first), "every committed event delivered")
	for origin, n := range dupsBy {
		require.LessOrEqual(t, n, perKill+perLost*run.lost[origin],
			"duplicates sent again by %s, after one crash and %d lost connections, exceed the bound", origin, run.lost[origin])
	}
	require.LessOrEqual(t, dups, perKill*cycles+perLost*lostConns, "duplicates exceed kills x (window + mark slots) + lost connections x window")
	shape.check(t, batched)
	checkOvertaking(t, chk, prios)
	require.Zero(t, dead, "dead messages")
	require.Zero(t, pending, "pending messages")
	require.Zero(t, attempts, "attempts charged: a crash must never count against a message")
}

// checkOvertaking says whether events went out of commit order within a
// topic as the run allows: never with one priority; with mixed priorities,
// some (a backlog left by a kill goes highest priority first), or the
// relay ignored them.
func checkOvertaking(t *testing.T, chk deliveryCheck, prios bool) {
	t.Helper()
	if prios {
		require.Positive(t, chk.overtook, "mixed priorities, yet every event went in commit order: no higher priority sent ahead of a backlog")
		return
	}
	require.Zero(t, chk.overtook, "one priority: first deliveries out of commit order within a topic")
}
