package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/powerfs"
)

// The command fault tests: a till process (TestCommandTillChild) receives
// commands from a real Mosquitto with the MQTT receiver, applies each in a
// transaction that writes the application's table (and lingers in it),
// and relays the answers; a backend in the test sends commands all along,
// with unique ids, and records the answers. The till is killed with
// SIGKILL at random moments, many of them inside a command's transaction
// (TestCommandsKill9), or killed and its file system's power cut
// (TestCommandsPowerLoss, at synchronous=FULL); after each, the database
// is checked; at the end a last till finishes the work and the answers
// are checked: every command applied exactly once (one row of the
// application's table per command id), every command answered at least
// once, always with the same answer (one event id, one data), the one its
// application committed, and no answer for a command not applied.
//
//	OUTBOX_CRASH_CYCLES=200 go test -race -run 'TestCommandsKill9$' -timeout 1h -v ./tests/integration
//	OUTBOX_POWERLOSS_CUTS=200 go test -race -run 'TestCommandsPowerLoss$' -timeout 1h -v ./tests/integration

// commandRun is the parent's side of a command fault test.
type commandRun struct {
	t       *testing.T
	mq      *harness.Mosquitto
	link    *harness.FaultProxy // the tills' way to the broker, with latency
	backend *commandBackend
	rng     *rand.Rand
	path    string
	sync    outbox.Synchronous
	fs      *powerfs.FS // nil: no power cuts

	kinds [3]int // kills at start, inside a transaction, while running
	// undid counts the kills that undid the transaction the till was last
	// in: they landed inside it, its row written, before its commit.
	undid int
	torn  int
	most  int // the most commands waiting after a kill
}

// Where in a till's life a kill falls.
const (
	killAtStart = iota // 0-400 ms after start: opening, recovering, connecting
	killInTx           // 0-3 ms after the till wrote a command's row, its transaction open
	killRunning        // 30-300 ms after its first command, anywhere
)

var killNames = [...]string{"at start", "inside a transaction", "while running"}

// startTill starts till n.
func (r *commandRun) startTill(n int) *commandTill {
	return startCommandTill(r.t, commandChild{DB: r.path, Broker: r.link.URL(), Client: fmt.Sprintf("till-%d", n),
		Seed: r.rng.Uint64(), Sync: r.sync, Protocol: childProtocol(n)})
}

// cycle starts a till, kills it at a moment of one of the kinds (cutting
// the power after, with powerfs), and checks the file it leaves.
func (r *commandRun) cycle(n int, verbose bool) {
	t := r.t
	p := r.startTill(n)
	defer p.done(verbose)
	kind := killInTx
	switch x := r.rng.IntN(4); {
	case x == 0:
		kind = killAtStart
	case x == 1:
		kind = killRunning
	}
	r.kinds[kind]++
	switch kind {
	case killAtStart:
		p.runFor(time.Duration(r.rng.IntN(400)) * time.Millisecond)
	case killInTx:
		// The k-th command's transaction, its row written, the till
		// sleeping in it for 5 to 10 ms: most kills land inside it.
		if p.waitInTx(1+r.rng.IntN(4), 10*time.Second) {
			p.runFor(time.Duration(r.rng.IntN(4)) * time.Millisecond)
		}
	case killRunning:
		p.waitInTx(1, 10*time.Second)
		p.runFor(time.Duration(30+r.rng.IntN(271)) * time.Millisecond)
	}
	p.kill()
	if r.fs != nil {
		if r.rng.IntN(3) == 0 {
			r.torn++
			r.fs.CutTorn(r.rng.Uint64())
		} else {
			r.fs.Cut()
		}
	}
	s := inspectTill(t, r.path)
	r.most = max(r.most, len(s.state)-s.check(t))
	if id := p.lastInTx(); id != "" && s.state[id] != "applied" {
		r.undid++
	}
	if r.fs != nil {
		// At FULL a commit that returned is durable: every answer the
		// backend has is of a command the cut left applied, with that
		// application's result.
		for _, d := range r.backend.received() {
			require.NoError(t, d.err)
			require.Len(t, s.applied[d.answer.Command], 1, "after cut %d: command %s answered, no longer applied", n, d.answer.Command)
		}
	}
}

// TestCommandsKill9 kills a till that applies commands with SIGKILL at
// random moments, most inside a command's transaction, then checks that
// every command was applied exactly once and answered with the answer its
// application committed. OUTBOX_CRASH_CYCLES sets the kills (default 30).
func TestCommandsKill9(t *testing.T) {
	testCommandFaults(t, "OUTBOX_CRASH_CYCLES", 30, nil)
}

// TestCommandsPowerLoss is TestCommandsKill9 on a file system that loses
// power after each kill (a third of the cuts torn), at synchronous=FULL:
// the same promises, and after each cut every answer received so far is
// of a command still applied. OUTBOX_POWERLOSS_CUTS sets the cuts (default
// 12).
func TestCommandsPowerLoss(t *testing.T) {
	if runtime.GOARCH == "arm" {
		t.Skip("powerfs does not run on linux/arm (go-fuse does not build there): no power-loss test")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse on this host (%v): no power-loss test", err)
	}
	testCommandFaults(t, "OUTBOX_POWERLOSS_CUTS", 12, func(t *testing.T) *powerfs.FS { return powerfs.Start(t, t.TempDir()) })
}

func testCommandFaults(t *testing.T, env string, def uint64, mount func(*testing.T) *powerfs.FS) {
	if testing.Short() {
		t.Skip("-short: the command fault tests re-execute the test binary (not possible under qemu-user)")
	}
	cycles := int(crashEnvInt(t, env, def))
	require.Positive(t, cycles, env)
	seedEnv := "OUTBOX_CRASH_SEED"
	if mount != nil {
		seedEnv = "OUTBOX_POWERLOSS_SEED"
	}
	seed := crashEnvInt(t, seedEnv, uint64(time.Now().UnixNano()))
	t.Logf("command fault test: %d %s, seed %d (%s=%d replays the same schedule)", cycles, map[bool]string{false: "kills", true: "cuts"}[mount != nil], seed, seedEnv, seed)
	began := time.Now()

	mq := harness.StartMosquitto(t, harness.MosquittoOptions{})
	r := &commandRun{t: t, mq: mq, link: startCrashLink(t, mq.Addr()), rng: rand.New(rand.NewPCG(seed, 0)),
		path: filepath.Join(t.TempDir(), "till.db"), sync: outbox.SyncFull}
	if mount != nil {
		r.fs = mount(t)
		r.path = filepath.Join(r.fs.Mountpoint(), "till.db")
	}
	createCommandTill(t, r.path)
	if r.fs != nil {
		powerfs.SyncDir(t, r.fs.Mountpoint())
	}
	r.backend = startCommandBackend(t, mq.Addr())
	verbose := os.Getenv("OUTBOX_TEST_LOG") != ""

	// The receiver's persistent session must exist before the first
	// command, or the broker has no one to keep it for: a first till runs
	// until it answers one of the probes sent every half second.
	first := r.startTill(0)
	defer first.done(verbose)
	var probed time.Time
	harness.Eventually(t, 30*time.Second, "the first till answers a probe", func() bool {
		if time.Since(probed) > 500*time.Millisecond {
			require.NoError(t, r.backend.send(t.Context(), true))
			probed = time.Now()
		}
		return r.backend.answered()
	})
	first.kill()

	stopSending := r.backend.sendEvery(r.rng.Uint64())
	for n := 1; n <= cycles; n++ {
		r.cycle(n, verbose)
		if testing.Verbose() && (n%10 == 0 || n == cycles) {
			t.Logf("  after kill %d: %d commands sent, %d answers received", n, len(r.backend.sentIDs()), len(r.backend.received()))
		}
	}
	require.NoError(t, stopSending())
	killing := time.Since(began)

	// A last till finishes the work: every command sent applied and
	// answered.
	last := r.startTill(cycles + 1)
	defer last.done(verbose)
	harness.Eventually(t, time.Minute, "the last till applies and answers every command", func() bool {
		if last.gone() || !r.backend.answeredAll(r.backend.sentIDs()) {
			return last.gone()
		}
		db := openReadOnly(t, r.path)
		defer db.Close()
		return r.backend.answeredAll(r.backend.expected(readTill(t, db)))
	})
	require.False(t, last.gone(), "the last till exited by itself")
	last.kill()

	s := inspectTill(t, r.path)
	sent := r.backend.expected(s)
	dups := checkAnswers(t, sent, r.backend.received(), s)
	t.Logf("command fault test figures (seed %d):", seed)
	t.Logf("  kills                     %5d  %d %s, %d aimed %s, %d %s; %d undid a command's transaction (its row written, not committed)",
		cycles, r.kinds[killAtStart], killNames[killAtStart], r.kinds[killInTx], killNames[killInTx], r.kinds[killRunning], killNames[killRunning], r.undid)
	if r.fs != nil {
		t.Logf("  power cuts                %5d  after each kill, %d torn; %d bytes dropped", r.fs.Cuts(), r.torn, r.fs.DroppedBytes())
	}
	t.Logf("  integrity_check           %5s  after every kill", "ok")
	t.Logf("  commands sent             %5d  each applied once (one row per id), each answered with its application's answer", len(sent))
	t.Logf("  answers received          %5d  %d of them again (the same event)", len(r.backend.received()), dups)
	t.Logf("  most waiting after a kill %5d", r.most)
	t.Logf("  time                      %5s  killing, %s in all", killing.Round(100*time.Millisecond), time.Since(began).Round(100*time.Millisecond))
	require.Positive(t, r.undid, "no kill landed inside a command's transaction")
	if r.fs != nil {
		require.Positive(t, r.fs.DroppedBytes(), "the cuts dropped nothing")
	}
}
