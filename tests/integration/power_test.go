package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/powerfs"
)

// The power-loss test: the crash test's child (TestPowerLossChild) commits
// orders and relays them to a broker in the parent, on a database on a
// file system that loses power (internal/powerfs). The parent kills it
// with SIGKILL at random moments and cuts the power: everything not
// fsynced is gone (or, in a torn cut, some of its pages). Then it checks
// the file, counts the commits the cut undid, and starts the next child.
// Some cuts fall while the broker is away, when at synchronous=NORMAL
// nothing makes a commit durable; the others while the child drains. At
// the end a relay in the parent drains what is left, and the test checks:
// every event whose order is in the database delivered, none whose order
// is not (a phantom: published, then undone by a cut), no sequence number
// under two ids, duplicates within the crash bound (the relay syncs its
// marks before more than that run ahead of them); at FULL no commit
// undone, at NORMAL some. At FULL every other child commits in
// transactions of its own and declares RelayOptions.WritersAtFull, so that
// its relay publishes with no fsync of the WAL first.
//
//	OUTBOX_POWERLOSS_CUTS=500 go test -race -run TestPowerLoss -v ./tests/integration  # per mode (default 20)
//	OUTBOX_POWERLOSS_SEED=12345 ...                                                     # the same schedule again

// powerBiteCuts is the fewest cuts per mode from which a run must show
// that at NORMAL they undid commits (TestPowerLoss's 20 do; the batched
// and priority runs' 4 need not).
const powerBiteCuts = 10

// powerEnvChild carries a child's orders (ordersChild): set,
// TestPowerLossChild runs them.
const powerEnvChild = "OUTBOX_POWERLOSS_CHILD"

// TestPowerLossChild is the process that loses power. It does nothing
// unless TestPowerLoss started it.
func TestPowerLossChild(t *testing.T) {
	runOrdersChild(t, powerEnvChild, "the child of TestPowerLoss; runs only when started by it")
}

// Where in a child's life a cut falls.
const (
	cutAtStart   = iota // 0-400 ms after the child started: opening, recovering, taking the lease
	cutDraining         // 30-400 ms after its relay connected
	cutAwayFirst        // the broker away from the child's start; 200-600 ms of commits
	cutAwayLater        // the broker goes 30-300 ms after the child connected; 100-400 ms more
	cutKinds
)

// powerRun is the parent's side of one mode of the power-loss test.
type powerRun struct {
	t        *testing.T
	mode     string
	sync     outbox.Synchronous
	fs       *powerfs.FS
	b        *harness.Mochi
	link     *harness.FaultProxy // the children's way to the broker, with latency
	rng      *rand.Rand
	path     string // the database, on the mount
	sidePath string // rolled-back event ids, one a line, outside the mount
	batched  bool   // the children batch and compress (ordersChild.Batched)
	prios    bool   // the children commit mixed priorities (ordersChild.Priorities)

	reported   map[string]string // every id a child reported committed -> that child
	undone     int               // of those, the ones a cut took away
	maxUndone  [2]int            // the most one cut took away, with the broker there and away
	kinds      [cutKinds]int
	awayUndid  int // cuts with the broker away that undid commits
	torn       int
	lostConns  map[string]int // per client, connections its relay lost
	maxBacklog int
}

// cycle starts a child, kills it and cuts the power at a moment chosen by
// kind, then checks the file and counts what the cut undid.
func (p *powerRun) cycle(n int, verbose bool) (pending int) {
	t := p.t
	client := fmt.Sprintf("power-%s-%d", p.mode, n)
	kind := cutDraining
	switch r := p.rng.IntN(12); {
	case r < 2:
		kind = cutAtStart
	case r < 4:
		kind = cutAwayFirst
	case r < 6:
		kind = cutAwayLater
	}
	p.kinds[kind]++
	if kind == cutAwayFirst {
		p.link.Down()
	}
	child := startKilledChild(t, client, "TestPowerLossChild", powerEnvChild, ordersChild{
		DB: p.path, Broker: p.link.URL(), Client: client, RolledBack: p.sidePath, Seed: p.rng.Uint64(),
		Sync: p.sync, Report: true, Checkpoint: true, Protocol: childProtocol(n),
		OwnTx: p.sync == outbox.SyncFull && n%2 == 0, Batched: p.batched, Priorities: p.prios})
	defer child.done(verbose)
	switch kind {
	case cutAtStart:
		child.runFor(time.Duration(p.rng.IntN(400)) * time.Millisecond)
	case cutDraining:
		child.waitConnected(p.b, client)
		child.runFor(time.Duration(30+p.rng.IntN(371)) * time.Millisecond)
	case cutAwayFirst:
		child.runFor(time.Duration(200+p.rng.IntN(401)) * time.Millisecond)
	case cutAwayLater:
		child.waitConnected(p.b, client)
		child.runFor(time.Duration(30+p.rng.IntN(271)) * time.Millisecond)
		p.link.Down()
		child.runFor(time.Duration(100+p.rng.IntN(301)) * time.Millisecond)
	}
	p.lostConns[client] += child.kill()
	// The child is dead and this process holds nothing open on the mount.
	if p.rng.IntN(3) == 0 {
		p.torn++
		p.fs.CutTorn(p.rng.Uint64())
	} else {
		p.fs.Cut()
	}
	away := kind == cutAwayFirst || kind == cutAwayLater
	if away {
		require.NoError(t, p.link.Up())
	}
	_, pending = crashInspect(t, p.path)

	// What survived of what this child reported committed. Only its own
	// commits can be undone: after a cut, whatever is on the disk is
	// durable.
	db := openReadOnly(t, p.path)
	orders := readOrders(t, db)
	require.NoError(t, db.Close())
	undone := 0
	for _, id := range child.committed() {
		p.reported[id] = client
		if _, ok := orders[id]; !ok {
			undone++
		}
	}
	p.undone += undone
	if away && undone > 0 {
		p.awayUndid++
	}
	i := 0
	if away {
		i = 1
	}
	p.maxUndone[i] = max(p.maxUndone[i], undone)
	if verbose {
		t.Logf("  cut %d (%s): %d commits reported, %d undone, %d pending", n, cutNames[kind], len(child.committed()), undone, pending)
	}
	return pending
}

var cutNames = [cutKinds]string{"at start", "draining", "broker away from the start", "broker gone later"}

// TestPowerLoss cuts the power under a child that commits and relays, at
// synchronous=FULL and at NORMAL, then lets a relay finish and checks every
// promise.
func TestPowerLoss(t *testing.T) {
	testPowerLossModes(t, 20, false, false)
}

// TestPowerLossBatched is TestPowerLoss with batches of up to
// crashBatchEvents events, compressed with zstd, over three topics (as
// TestCrashKill9Batched). OUTBOX_POWERLOSS_CUTS sets its cuts too.
func TestPowerLossBatched(t *testing.T) {
	testPowerLossModes(t, 4, true, false)
}

// TestPowerLossPriorities is TestPowerLossBatched with each event of
// priority 0, 5 or 9, after a backlog of them (as
// TestCrashKill9Priorities): a batch holds one topic and one priority,
// first deliveries come in commit order within each, a backlog goes
// highest priority first. OUTBOX_POWERLOSS_CUTS sets its cuts too.
func TestPowerLossPriorities(t *testing.T) {
	testPowerLossModes(t, 4, true, true)
}

func testPowerLossModes(t *testing.T, defaultCuts uint64, batched, prios bool) {
	if testing.Short() {
		t.Skip("-short: the power-loss test re-executes the test binary (not possible under qemu-user)")
	}
	if runtime.GOARCH == "arm" {
		t.Skip("powerfs does not run on linux/arm (go-fuse does not build there): no power-loss test")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse on this host (%v): no power-loss test", err)
	}
	cuts := int(crashEnvInt(t, "OUTBOX_POWERLOSS_CUTS", defaultCuts))
	require.Positive(t, cuts, "OUTBOX_POWERLOSS_CUTS")
	seed := crashEnvInt(t, "OUTBOX_POWERLOSS_SEED", uint64(time.Now().UnixNano()))
	t.Logf("power-loss test: %d cuts per mode, seed %d (OUTBOX_POWERLOSS_SEED=%d replays the same schedule), batched %v, priorities %v", cuts, seed, seed, batched, prios)
	for _, m := range []struct {
		name string
		sync outbox.Synchronous
	}{{"FULL", outbox.SyncFull}, {"NORMAL", outbox.SyncNormal}} {
		t.Run(m.name, func(t *testing.T) { testPowerLoss(t, m.name, m.sync, cuts, seed, batched, prios) })
	}
}

func testPowerLoss(t *testing.T, mode string, sync outbox.Synchronous, cuts int, seed uint64, batched, prios bool) {
	began := time.Now()
	backing := t.TempDir()
	fs := powerfs.Start(t, backing)
	b := harness.StartMochi(t, harness.MochiOptions{})
	rec := recordEvents(t, b)
	run := &powerRun{
		t: t, mode: mode, sync: sync, fs: fs, b: b, link: startCrashLink(t, b.Addr()),
		rng:       rand.New(rand.NewPCG(seed, uint64(sync))),
		path:      filepath.Join(fs.Mountpoint(), "till.db"),
		sidePath:  filepath.Join(t.TempDir(), "rolledback.txt"),
		reported:  map[string]string{},
		lostConns: map[string]int{},
		batched:   batched,
		prios:     prios,
	}
	// The schema is durable before the first cut: the experiment is the
	// orders, not a database that was never there. So is a backlog of
	// mixed priorities, committed at FULL.
	createOrders(t, run.path)
	if prios {
		commitBacklog(t, run.path, crashBacklog)
	}
	powerfs.SyncDir(t, fs.Mountpoint())

	verbose := os.Getenv("OUTBOX_TEST_LOG") != ""
	var backlog int
	for n := 1; n <= cuts; n++ {
		backlog = run.cycle(n, verbose)
		run.maxBacklog = max(run.maxBacklog, backlog)
	}
	cutting := time.Since(began)

	ob, stop, finalLog := drainRest(t, run.path, sync, b.URL(), "power-final", backlog, batched)
	committed := readOrders(t, ob.DB())
	rolledBack := readRolledBack(t, run.sidePath, committed)
	missing := undelivered(rec, committed)
	stop()
	run.lostConns["power-final"] += strings.Count(finalLog.String(), crashLostConn)
	chk := checkDeliveries(rec.events(), committed, rolledBack)
	shape := rec.shape("power-final")
	maxDups, maxBy := chk.mostDups()

	// lost: commits that returned, still in the database, never delivered;
	// rolled_back: commits that returned and are no longer there.
	lost, gone := 0, 0
	for id := range run.reported {
		if _, ok := committed[id]; !ok {
			gone++
		} else if _, ok := chk.first[id]; !ok {
			lost++
		}
	}
	t.Logf("powerloss: sync=%s batched=%v priorities=%v cuts=%d committed=%d lost=%d rolled_back=%d phantom=%d seq_reused=%d duplicates=%d max_dup_per_cut=%d overtook=%d integrity=ok dropped_bytes=%d",
		mode, batched, prios, fs.Cuts(), len(run.reported), lost, gone, len(chk.phantom), chk.seqReused, chk.dups, maxDups, chk.overtook, fs.DroppedBytes())
	t.Logf("  %d MQTT messages, %s", shape.messages, shape)
	lostConns := 0
	for _, n := range run.lostConns {
		lostConns += n
	}
	t.Logf("  cuts: %d at start, %d draining, %d with the broker away (%d from the start, %d gone later; %d of them undid commits), %d torn",
		run.kinds[cutAtStart], run.kinds[cutDraining], run.kinds[cutAwayFirst]+run.kinds[cutAwayLater],
		run.kinds[cutAwayFirst], run.kinds[cutAwayLater], run.awayUndid, run.torn)
	t.Logf("  most commits one cut undid: %d with the broker there, %d with it away", run.maxUndone[0], run.maxUndone[1])
	t.Logf("  %d orders in the database at the end, %d rolled back on purpose; most duplicates sent by %s; %d connections lost; most pending after a cut %d; %s cutting, %s in all",
		len(committed), len(rolledBack), maxBy, lostConns, run.maxBacklog, cutting.Round(100*time.Millisecond), time.Since(began).Round(100*time.Millisecond))

	require.NoError(t, chk.bad)
	if len(missing) > 0 {
		t.Fatalf("LOST: %d of %d events in the database never delivered, e.g. %s (order %d, committed by %s)",
			len(missing), len(committed), missing[0], committed[missing[0]].rowid, committed[missing[0]].client)
	}
	require.Zero(t, lost, "lost: commits that returned, in the database, never delivered")
	require.Empty(t, chk.phantoms(), "phantom")
	require.Zero(t, chk.seqReused, "sequence numbers delivered under two ids")
	require.Zero(t, chk.seqChanged, "duplicates must carry their event's sequence")
	require.Empty(t, chk.disorder, "first deliveries out of commit order")
	require.Equal(t, run.undone, gone, "commits undone, counted after each cut and at the end")
	switch {
	case sync == outbox.SyncFull:
		require.Zero(t, gone, "at FULL a commit that returned is durable")
	case cuts < powerBiteCuts:
		// A few cuts may all fall just after a checkpoint (the child's,
		// which syncs): too few to require that they bite.
		t.Logf("  %d cuts: whether they undid commits is checked from %d cuts (undone %d; with the broker away %d)", cuts, powerBiteCuts, gone, run.awayUndid)
	default:
		require.Positive(t, gone, "at NORMAL the cuts must undo commits, or they do not bite")
		if run.kinds[cutAwayFirst]+run.kinds[cutAwayLater] > 0 {
			require.Positive(t, run.awayUndid, "at NORMAL, with the broker away, nothing makes a commit durable: the cuts then must undo some")
		}
	}
	// A cut undoes the relay's marks made since the WAL's last fsync, and
	// the relay never lets more than a crash's bound run ahead of that (see
	// TestPublishedAheadOfDurableMarkBounded), in messages, each of up to
	// MaxEvents events when batched.
	perMsg := 1
	if batched {
		perMsg = crashBatchEvents
	}
	perCut, perLost := (crashWindow+max(crashWindow, 256))*perMsg, crashWindow*perMsg
	for origin, n := range chk.dupsBy {
		require.LessOrEqual(t, n, perCut+perLost*run.lostConns[origin],
			"duplicates sent again by %s, after one cut and %d lost connections, exceed the bound", origin, run.lostConns[origin])
	}
	require.Positive(t, fs.DroppedBytes(), "the cuts dropped nothing")
	shape.check(t, batched)
	checkOvertaking(t, chk, prios)
	require.Zero(t, countState(t, ob, "dead"), "dead messages")
	var attempts int
	require.NoError(t, ob.DB().QueryRow(`SELECT coalesce(max(attempts), 0) FROM outbox`).Scan(&attempts))
	require.Zero(t, attempts, "attempts charged: a cut must never count against a message")
}
