package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeoutbox/outbox/internal/sqlconn"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// The stalled lease holder: a child process (this test binary, running
// TestStallChild) relays a backlog to a broker in the parent, slowly; the
// parent stops it with SIGSTOP mid-drain for longer than the lease TTL, lets
// a relay of its own take the lease over and drain, then lets the child go
// on with SIGCONT. Awake again, the child must publish nothing it had not
// already decided to hand over before it was stopped.

const (
	stallEnvDB     = "OUTBOX_STALL_CHILD_DB" // set: TestStallChild relays this database
	stallEnvBroker = "OUTBOX_STALL_CHILD_BROKER"
	stallEnvClient = "OUTBOX_STALL_CHILD_CLIENT"
	stallEnvProto  = "OUTBOX_STALL_CHILD_MQTT" // the MQTT version the child speaks

	stallTopic    = "stall/orders"
	stallLeaseTTL = time.Second
	stallBacklog  = 2000
	// The child's acknowledgements come this late, with a window of
	// stallWindow: about 800 messages a second, so that the stop lands
	// mid-drain.
	stallAckDelay = 5 * time.Millisecond
	stallWindow   = 4
	// The child is stopped once it reported this many hand-offs.
	stallStopAfter = 200

	stallHandOff = "hand-off "
	stallReturn  = "run returned: "
)

// stallPublisher is the child's Publisher: it delays the
// acknowledgements.
type stallPublisher struct {
	*MQTTPublisher
}

// stallHandingOff reports on stdout each message the relay is about to hand
// over, before the relay's last check of its lease.
func stallHandingOff(seq int64) {
	// One write per line, unbuffered: a stop cannot split it, and the
	// parent has every line written before the stop.
	fmt.Fprintf(os.Stdout, "%s%d\n", stallHandOff, seq)
}

func (p stallPublisher) Publish(topic string, payload []byte) Token {
	return p.PublishWithProperties(topic, payload, PublishProperties{})
}

// PublishWithProperties is what the relay calls over MQTT 5 (a CloudEvents
// message has a Content Type there): the embedded publisher's would skip
// the delay.
func (p stallPublisher) PublishWithProperties(topic string, payload []byte, props PublishProperties) Token {
	inner := p.MQTTPublisher.PublishWithProperties(topic, payload, props)
	t := &slowToken{inner: inner, done: make(chan struct{})}
	go func() {
		<-inner.Done()
		<-time.After(stallAckDelay) // the link's latency, not a wait for anything
		close(t.done)
	}()
	return t
}

type slowToken struct {
	inner Token
	done  chan struct{}
}

func (t *slowToken) Done() <-chan struct{} { return t.done }
func (t *slowToken) Error() error          { return t.inner.Error() }

// TestStallChild is the process that gets stopped. It does nothing unless
// TestStalledLeaseHolder started it.
func TestStallChild(t *testing.T) {
	path := os.Getenv(stallEnvDB)
	if path == "" {
		t.Skip("the child of TestStalledLeaseHolder; runs only when started by it")
	}
	die := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "STALL CHILD FAILED: "+format+"\n", args...)
		os.Exit(2)
	}
	// The parent holds our stdin open: EOF means it is gone, and an
	// orphan must not run on.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	level := slog.LevelWarn
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ob, err := Open(context.Background(), path, Options{Logger: logger})
	if err != nil {
		die("open: %v", err)
	}
	client := os.Getenv(stallEnvClient)
	proto, err := ParseMQTTProtocol(os.Getenv(stallEnvProto))
	require.NoError(t, err)
	mp, err := NewMQTTPublisher(stallMQTTOptions(os.Getenv(stallEnvBroker), client, proto))
	if err != nil {
		die("publisher: %v", err)
	}
	relay, err := ob.NewRelay(stallPublisher{mp}, stallRelayOptions(client, stallWindow))
	if err != nil {
		die("relay: %v", err)
	}
	relay.hooks.beforeHandOff = stallHandingOff
	err = relay.Run(context.Background())
	fmt.Fprintf(os.Stdout, "%s%v\n", stallReturn, err)
	os.Exit(0)
}

func stallRelayOptions(owner string, window int) RelayOptions {
	return RelayOptions{
		Source:          "/stall/till",
		Window:          window,
		AckTimeout:      10 * time.Second,
		Reconnect:       Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		LeaseTTL:        stallLeaseTTL,
		ShutdownTimeout: time.Second,
		Owner:           owner,
	}
}

// stallMQTTOptions keep the child's connection alive through the stop: the
// broker would close it after one and a half keepalives of silence.
func stallMQTTOptions(brokerURL, clientID string, proto MQTTProtocol) MQTTOptions {
	return MQTTOptions{Broker: brokerURL, ClientID: clientID, ConnectTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second, KeepAlive: 60 * time.Second, PingTimeout: 10 * time.Second, Protocol: proto}
}

// stallHook records every publish the broker receives, with its client, in
// the order received: OnPublish runs in the client's read loop, before the
// PUBACK.
type stallHook struct {
	mochi.HookBase
	mu   sync.Mutex
	pubs []stallPublish
}

type stallPublish struct {
	client string
	seq    int64
}

func (h *stallHook) ID() string { return "stall-recorder" }
func (h *stallHook) Provides(b byte) bool {
	return b == mochi.OnPublish
}

func (h *stallHook) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	ev, err := DecodeEvent(pk.Payload)
	seq := ev.Sequence
	if err != nil {
		seq = -1
	}
	h.mu.Lock()
	h.pubs = append(h.pubs, stallPublish{client: cl.ID, seq: seq})
	h.mu.Unlock()
	return pk, nil
}

func (h *stallHook) since(n int) []stallPublish {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]stallPublish(nil), h.pubs[n:]...)
}

func (h *stallHook) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.pubs)
}

// stallOut reads the child's stdout.
type stallOut struct {
	f        *os.File
	partial  []byte
	err      error          // of the last read
	reported map[int64]bool // hand-offs the child announced
	returned string         // what the child's Relay.Run returned, once said
}

// readUntil takes the lines the child writes until cond holds (nil), the
// deadline passes (os.ErrDeadlineExceeded), or the child closed its stdout
// (io.EOF).
func (o *stallOut) readUntil(t *testing.T, deadline time.Time, cond func() bool) error {
	t.Helper()
	require.NoError(t, o.f.SetReadDeadline(deadline))
	o.err = nil
	buf := make([]byte, 4096)
	for {
		for {
			i := bytes.IndexByte(o.partial, '\n')
			if i < 0 {
				break
			}
			line := string(o.partial[:i])
			o.partial = o.partial[i+1:]
			switch {
			case strings.HasPrefix(line, stallHandOff):
				seq, err := strconv.ParseInt(strings.TrimPrefix(line, stallHandOff), 10, 64)
				require.NoError(t, err, "line %q", line)
				o.reported[seq] = true
			case strings.HasPrefix(line, stallReturn):
				o.returned = strings.TrimPrefix(line, stallReturn)
			}
			if cond != nil && cond() {
				return nil
			}
		}
		if o.err != nil {
			return o.err
		}
		var n int
		n, o.err = o.f.Read(buf)
		o.partial = append(o.partial, buf[:n]...)
	}
}

// stopped reports whether every thread of the process is stopped: SIGSTOP
// takes effect on each thread as it next enters the kernel or is scheduled.
func stopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] != 'T' {
			return false
		}
	}
	return true
}

// TestStalledLeaseHolder stops a relaying process for longer than the lease
// TTL while a second relay takes over, then lets it go on: every publish
// the broker receives from it after the wake must be one it had reported,
// before the stop, as about to be handed over.
func TestStalledLeaseHolder(t *testing.T) { forProtocols(t, testStalledLeaseHolder) }

func testStalledLeaseHolder(t *testing.T, proto MQTTProtocol) {
	if testing.Short() {
		t.Skip("-short: the test re-executes the test binary (not possible under qemu-user)")
	}
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("needs /proc to see that the child is stopped")
	}
	ctx := context.Background()
	b := startBroker(t)
	hook := &stallHook{}
	require.NoError(t, b.srv.AddHook(hook, nil))

	path := filepath.Join(t.TempDir(), "till.db")
	ob, err := Open(ctx, path, Options{Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
		for i := range stallBacklog {
			if err := ob.Enqueue(ctx, tx, Message{Topic: stallTopic, Payload: fmt.Appendf(nil, `{"n":%d}`, i)}); err != nil {
				return err
			}
		}
		return nil
	}))

	const child, successor = "stall-child", "stall-successor"
	cmd := exec.Command(os.Args[0], "-test.run=^TestStallChild$", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), stallEnvDB+"="+path, stallEnvBroker+"="+b.url(), stallEnvClient+"="+child, stallEnvProto+"="+proto.String())
	// The child exits when this pipe closes, should this process die
	// without killing it.
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	defer pr.Close()
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = pw, &stderr
	require.NoError(t, cmd.Start())
	pw.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		select {
		case <-exited:
		default:
			cmd.Process.Signal(syscall.SIGCONT)
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("child output:\n%s", stderr.String())
		}
	}()
	out := &stallOut{f: pr, reported: map[int64]bool{}}
	// A stop while the child holds SQLite's write lock would keep the
	// successor out until the wake: stop it again elsewhere.
	writeLocked := func() bool {
		db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?_pragma=busy_timeout(0)&_txlock=immediate")
		require.NoError(t, err)
		defer db.Close()
		tx, err := db.Begin()
		if err != nil {
			require.True(t, sqlconn.IsBusy(err), "BEGIN IMMEDIATE: %v", err)
			return true
		}
		require.NoError(t, tx.Rollback())
		return false
	}

	attempts := 0
	for {
		attempts++
		require.LessOrEqual(t, attempts, 20, "the child held the write lock at every stop")
		want := len(out.reported) + stallStopAfter
		require.NoError(t, out.readUntil(t, time.Now().Add(30*time.Second), func() bool { return len(out.reported) >= want }),
			"the child reports its hand-offs")
		require.Empty(t, out.returned, "the child's relay returned before the stop")
		require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
		eventually(t, 10*time.Second, "the child stopped", func() bool { return stopped(cmd.Process.Pid) })
		if !writeLocked() {
			break
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	}
	// Stopped: what it wrote before the stop is all in the pipe, and a
	// read that times out has taken all of it.
	require.ErrorIs(t, out.readUntil(t, time.Now().Add(200*time.Millisecond), nil), os.ErrDeadlineExceeded)
	require.Empty(t, out.returned)
	before := len(out.reported)
	reportedBefore := make(map[int64]bool, before)
	for seq := range out.reported {
		reportedBefore[seq] = true
	}
	require.Less(t, before, stallBacklog, "the child was stopped mid-drain")
	stoppedAt := time.Now()

	// A relay of this process takes the lease over, after a TTL, and drains.
	pub, err := NewMQTTPublisher(stallMQTTOptions(b.url(), successor, proto))
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	r, err := ob.NewRelay(pub, stallRelayOptions(successor, 0))
	require.NoError(t, err)
	stopSuccessor := startRelay(t, r)
	eventually(t, 20*time.Second, "the successor holds the lease", func() bool {
		st, err := ob.Stats(ctx)
		require.NoError(t, err)
		return st.LeaseOwner == successor
	})
	eventually(t, 30*time.Second, "the successor drained the outbox", func() bool { return countState(t, ob, "pending") == 0 })
	stall := time.Since(stoppedAt)

	// The child wakes while this process holds SQLite's write lock, as the
	// successor does while it marks: the child's renewal, which would
	// tell it that its lease is gone, waits; whatever it publishes
	// meanwhile it publishes without a valid lease. The lock is held until
	// the child announces a hand-off, or for two seconds.
	locker, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	require.NoError(t, err)
	defer locker.Close()
	lock, err := locker.Begin()
	require.NoError(t, err)
	defer lock.Rollback() // on a failure before the rollback below
	mark := hook.count()
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	err = out.readUntil(t, time.Now().Add(2*time.Second), func() bool { return len(out.reported) > before || out.returned != "" })
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		require.NoError(t, err)
	}
	require.NoError(t, lock.Rollback())
	err = out.readUntil(t, time.Now().Add(20*time.Second), func() bool { return out.returned != "" })
	require.NoError(t, err, "the child's relay returns")
	reportedAfter := len(out.reported) - before
	select {
	case err := <-exited:
		exited <- err
		require.NoError(t, err, "the child's exit")
	case <-time.After(10 * time.Second):
		t.Fatal("the child did not exit after its relay returned")
	}
	// Everything the child sent has been read by the broker once its
	// session is gone.
	eventually(t, 10*time.Second, "the broker saw the child go", func() bool {
		_, ok := b.srv.Clients.Get(child)
		return !ok
	})
	for _, bad := range []string{"DATA RACE", "STALL CHILD FAILED", "panic:"} {
		require.NotContains(t, stderr.String(), bad)
	}

	var afterWake, stale []int64
	for _, p := range hook.since(mark) {
		if p.client != child {
			continue
		}
		afterWake = append(afterWake, p.seq)
		if !reportedBefore[p.seq] {
			stale = append(stale, p.seq)
		}
	}
	childTotal := 0
	for _, p := range hook.since(0) {
		if p.client == child {
			childTotal++
		}
	}
	t.Logf("stalled lease holder: stopped after %d hand-offs (%d stop attempts), stopped for %s (lease TTL %s)",
		before, attempts, stall.Round(time.Millisecond), stallLeaseTTL)
	t.Logf("  the child: %d publishes received by the broker in all, %d after the wake, %d of them not announced before the stop; %d hand-offs announced after the wake",
		childTotal, len(afterWake), len(stale), reportedAfter)
	t.Logf("  the child's relay returned: %s", out.returned)
	require.Empty(t, stale, "publishes by the stalled relay after it woke that it had not handed over before the stop")
	require.Contains(t, out.returned, ErrLeaseLost.Error(), "the child's relay stops: its lease is lost")
	stopSuccessor()
}
