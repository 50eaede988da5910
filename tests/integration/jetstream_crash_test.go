package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/natsjs"
)

// The JetStream kill -9 test: the relay is a child process (this test
// binary, running TestJetStreamCrashChild) that drains the outbox into a
// stream through natsjs, while the application in the parent commits
// events of three topics and mixed priorities to the same file; the parent
// kills the relay with SIGKILL while it publishes, over and over. Each
// killed relay leaves PubAcks unrecorded (or unread), and the next one
// sends those events again; the stream, deduplicating by Nats-Msg-Id
// within its duplicate window, must store each committed event once, in
// commit order per subject within each priority.
//
//	OUTBOX_CRASH_CYCLES=500 go test -race -run TestJetStreamKill9 -v ./tests/integration  # default 30 kills
//	OUTBOX_CRASH_SEED=12345 ...                                                           # the same delays again

// jsCrashEnvChild carries a child's orders (ordersChild: DB, Broker,
// Client): set, TestJetStreamCrashChild runs its relay.
const jsCrashEnvChild = "OUTBOX_JETSTREAM_CRASH_CHILD"

// TestJetStreamCrashChild is the relay that gets killed. It does nothing
// unless TestJetStreamKill9 started it.
func TestJetStreamCrashChild(t *testing.T) {
	s := os.Getenv(jsCrashEnvChild)
	if s == "" {
		t.Skip("the child of TestJetStreamKill9; runs only when started by it")
	}
	var c ordersChild
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s: %v\n", childFailed, jsCrashEnvChild, err)
		os.Exit(2)
	}
	runJSRelayChild(c)
}

// runJSRelayChild relays c.DB to the NATS server c.Broker until killed; it
// exits on a failure or when the parent is gone.
func runJSRelayChild(c ordersChild) {
	die := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, childFailed+": "+format+"\n", args...)
		os.Exit(2)
	}
	// The parent holds our stdin open: EOF means it is gone.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	level := slog.LevelWarn
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx := context.Background()
	ob, err := outbox.Open(ctx, c.DB, outbox.Options{Logger: logger})
	if err != nil {
		die("open: %v", err)
	}
	pub, err := natsjs.New(natsjs.Options{Servers: []string{c.Broker}, Name: c.Client, ConnectTimeout: 5 * time.Second})
	if err != nil {
		die("publisher: %v", err)
	}
	relay, err := ob.NewRelay(pub, crashRelayOptions(c.Client, false))
	if err != nil {
		die("relay: %v", err)
	}
	// Run returns only on a failure here: nothing cancels it.
	die("relay.Run returned: %v", relay.Run(ctx))
}

// TestJetStreamKill9 kills a relay publishing to JetStream with SIGKILL 30
// times (OUTBOX_CRASH_CYCLES), into a stream the test creates first, then
// lets a last relay drain the rest: the stream holds every committed event
// exactly once, in commit order per subject within each priority.
func TestJetStreamKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the crash test re-executes the test binary (not possible under qemu-user)")
	}
	cycles := int(crashEnvInt(t, "OUTBOX_CRASH_CYCLES", 30))
	require.Positive(t, cycles, "OUTBOX_CRASH_CYCLES")
	seed := crashEnvInt(t, "OUTBOX_CRASH_SEED", uint64(time.Now().UnixNano()))
	t.Logf("JetStream crash test: %d cycles, seed %d (OUTBOX_CRASH_SEED=%d replays the same delays)", cycles, seed, seed)
	began := time.Now()
	rng := rand.New(rand.NewPCG(seed, 0))

	n := harness.StartNATS(t)
	url := "nats://" + n.Addr
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "TILL", Subjects: []string{jsStreamSubjects},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute})
	require.NoError(t, err)
	arrivals := countArrivals(t, nc)

	path := filepath.Join(t.TempDir(), "till.db")
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	w := startJSWriter(t, ob, 4*time.Millisecond, 1, seed)

	verbose := os.Getenv("OUTBOX_TEST_LOG") != ""
	var early, relayed int
	for i := 1; i <= cycles; i++ {
		client := fmt.Sprintf("js-crash-child-%d", i)
		child := startKilledChild(t, fmt.Sprintf("child %d", i), "TestJetStreamCrashChild", jsCrashEnvChild,
			ordersChild{DB: path, Broker: url, Client: client})
		// Most kills land while the child publishes: the delay starts once
		// the server has had a message from it. The others land at any
		// moment from its start.
		var delay time.Duration
		if rng.IntN(6) == 0 {
			early++
			delay = time.Duration(rng.IntN(300)) * time.Millisecond
		} else {
			relayed++
			delay = time.Duration(rng.IntN(200)) * time.Millisecond
			from := arrivals.n.Load()
			harness.Eventually(t, 20*time.Second, client+" publishing (or exited)", func() bool {
				return child.gone() || arrivals.n.Load() > from
			})
		}
		child.runFor(delay)
		child.kill()
		child.done(verbose)
	}
	killing := time.Since(began)
	committed := w.finish()

	// A last relay, in this process, drains what is left.
	pub, err := natsjs.New(natsjs.Options{Servers: []string{url}})
	require.NoError(t, err)
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	stop := startRelay(t, r)
	harness.Eventually(t, 60*time.Second, "the last relay drained the outbox", func() bool { return countState(t, ob, "pending") == 0 })
	stop()
	require.Zero(t, countState(t, ob, "dead"), "dead")

	stored := readStream(t, js, "TILL")
	c := checkStream(stored, committed)
	t.Logf("JetStream crash test figures (seed %d, window %d):", seed, crashWindow)
	t.Logf("  kill -9 cycles            %7d  (%d while publishing, 0-200 ms after the server had one of its messages; %d at 0-300 ms after start)", cycles, relayed, early)
	t.Logf("  events committed          %7d  on %d subjects, priorities %v", len(committed), len(jsTopics), crashPriorities)
	t.Logf("  messages reaching NATS    %7d  (re-sends included)", arrivals.n.Load())
	t.Logf("  messages in the stream    %7d  duplicates %d, missing %d, out of order %d, overtaking %d (a higher priority's, allowed)",
		c.stored, c.dups, len(c.missing), len(c.disorder), c.overtook)
	t.Logf("  time                      %7s  killing, %s in all", killing.Round(100*time.Millisecond), time.Since(began).Round(100*time.Millisecond))
	c.require(t)
	require.Greater(t, arrivals.n.Load(), int64(len(committed)), "no re-send reached the server: the kills tested nothing")
}
