package examples_test

// These tests build the example programs and run them as a user would, then
// check the numbers they print. Every run has its own deadline; nothing
// waits on a sleep.

import (
	"bufio"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/consumer"
	"github.com/edgeoutbox/outbox/internal/harness"
)

const (
	buildTimeout = 5 * time.Minute // a cold build compiles SQLite (pure Go)
	runTimeout   = 60 * time.Second
)

var (
	posSummary      = regexp.MustCompile(`(?m)^sales (\d+), declined (\d+), events committed (\d+), pending (\d+)$`)
	posDelivered    = regexp.MustCompile(`(?m)^delivered (\d+) unique`)
	consumerSummary = regexp.MustCompile(`(?m)^applied (\d+), duplicates (\d+), malformed (\d+)$`)
	appliedLine     = regexp.MustCompile(`(?m)^applied source=(\S+) id=(\S+) seq=(\d+) type=(\S+)$`)
)

// build compiles ./<name> (pos, consumer, commands/till...) into a
// temporary directory and returns the binary's path. With a -race test
// binary, the example is built with -race as well.
func build(t *testing.T, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	bin := filepath.Join(t.TempDir(), filepath.Base(name))
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.CommandContext(ctx, "go", append(args, "./"+name)...).CombinedOutput()
	require.NoError(t, err, "go build ./%s:\n%s", name, out)
	return bin
}

// run runs bin with args to completion and returns its stdout; a non-zero
// exit fails the test, with both outputs in the message.
func run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	var stdout, stderr strings.Builder
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("%s %s\nstdout:\n%sstderr:\n%s", filepath.Base(bin), strings.Join(args, " "), stdout.String(), stderr.String())
	require.NoError(t, err, "%s %v (context: %v)", filepath.Base(bin), args, ctx.Err())
	return stdout.String()
}

// numbers returns the integer submatches of re in out; the line must be there.
func numbers(t *testing.T, re *regexp.Regexp, out string) []int {
	t.Helper()
	m := re.FindStringSubmatch(out)
	require.NotNil(t, m, "no line matching %q in:\n%s", re, out)
	var ns []int
	for _, s := range m[1:] {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		ns = append(ns, n)
	}
	return ns
}

// TestPOS runs the till with its defaults: 20 sales, every 7th declined,
// two events per committed sale, an embedded broker that checks delivery.
func TestPOS(t *testing.T) {
	t.Parallel()
	out := run(t, build(t, "pos"))

	got := numbers(t, posSummary, out)
	require.Equal(t, []int{20, 2, 36, 0}, got, "sales, declined, events committed, pending")
	require.Equal(t, []int{36}, numbers(t, posDelivered, out), "delivered unique = events committed")
}

// TestConsumerDemo runs the consumer against its own embedded broker and
// demo events: 3 distinct events (two of them share an id but not the
// source), one redelivered, one not JSON. Once with its default temporary
// database, once with --db, whose contents are then checked: the handler's
// rows and the inbox agree with what was printed.
func TestConsumerDemo(t *testing.T) {
	t.Parallel()
	consumerBin := build(t, "consumer")

	check := func(out string) map[string]string {
		t.Helper()
		require.Equal(t, []int{3, 1, 1}, numbers(t, consumerSummary, out), "applied, duplicates, malformed")
		ids := map[string]string{} // "source seq type" -> id
		for _, m := range appliedLine.FindAllStringSubmatch(out, -1) {
			k := m[1] + " " + m[3] + " " + m[4]
			require.NotContains(t, ids, k, "printed twice:\n%s", out)
			ids[k] = m[2]
		}
		require.Len(t, ids, 3, out)
		first := ids["/stores/1/tills/1 1 com.example.pos.OrderPlaced"]
		require.NotEmpty(t, first, out)
		require.NotEmpty(t, ids["/stores/1/tills/1 2 com.example.pos.PaymentCaptured"], out)
		require.Equal(t, first, ids["/stores/1/tills/2 1 com.example.pos.OrderPlaced"], "same id, other source: another event")
		return ids
	}
	check(run(t, consumerBin, "--demo", "--count", "3"))

	path := filepath.Join(t.TempDir(), "consumer.db")
	ids := check(run(t, consumerBin, "--demo", "--count", "3", "--db", path))
	db, err := outbox.OpenDB(path, outbox.DBOptions{})
	require.NoError(t, err)
	defer db.Close()
	rows, err := db.Query(`SELECT source, id, seq, type FROM orders_seen`)
	require.NoError(t, err)
	defer rows.Close()
	stored := map[string]string{}
	for rows.Next() {
		var source, id, typ string
		var seq int
		require.NoError(t, rows.Scan(&source, &id, &seq, &typ))
		stored[source+" "+strconv.Itoa(seq)+" "+typ] = id
	}
	require.NoError(t, rows.Err())
	require.Equal(t, ids, stored, "orders_seen holds exactly the events printed")
	in, err := consumer.NewInbox(context.Background(), db, consumer.InboxOptions{})
	require.NoError(t, err)
	st, err := in.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, consumer.InboxStats{Applied: 3, Quarantined: 1}, st, "the inbox remembers 3 events and kept the malformed message")
}

// TestPOSToConsumer runs both against one broker (started here): the
// consumer receives the till's events while it is connected, and — thanks
// to its persistent session — also those published while it was away.
func TestPOSToConsumer(t *testing.T) {
	t.Parallel()
	pos, consumerBin := build(t, "pos"), build(t, "consumer")

	broker := harness.StartMochi(t, harness.MochiOptions{}).URL()
	clientID := "consumer-" + t.Name()
	// The consumer's database goes with its client id: both runs use it.
	db := filepath.Join(t.TempDir(), "consumer.db")

	// 1. The consumer is up: it sees one sale (two events) live.
	c := start(t, consumerBin, "--broker", broker, "--client-id", clientID, "--db", db, "--count", "2")
	c.waitFor(t, "subscribed to stores/# ")
	require.Equal(t, []int{1, 0, 2, 0}, numbers(t, posSummary, run(t, pos, "--broker", broker, "--orders", "1")))
	out := c.wait(t)
	require.Equal(t, []int{2, 0, 0}, numbers(t, consumerSummary, out), "applied, duplicates, malformed")
	require.Len(t, appliedLine.FindAllString(out, -1), 2, out)

	// 2. The consumer is away while the till sells 20 (2 declined).
	require.Equal(t, []int{20, 2, 36, 0}, numbers(t, posSummary, run(t, pos, "--broker", broker, "--rate", "200")))

	// 3. It comes back with the same client id: the broker delivers what
	// was published in its absence.
	out = run(t, consumerBin, "--broker", broker, "--client-id", clientID, "--db", db, "--count", "36")
	require.Equal(t, []int{36, 0, 0}, numbers(t, consumerSummary, out), "applied, duplicates, malformed")
	// Every committed event once: sequence numbers 1..36 (the till's
	// database was new), half orders, half payments. Not necessarily in
	// that order: a broker may resend a stored session's messages in any
	// order (mochi does), so only the set is checked.
	types := map[string]int{}
	seqs := map[int]int{}
	for _, m := range appliedLine.FindAllStringSubmatch(out, -1) {
		require.Equal(t, "/stores/1/tills/1", m[1])
		types[m[4]]++
		seq, err := strconv.Atoi(m[3])
		require.NoError(t, err)
		seqs[seq]++
	}
	require.Equal(t, map[string]int{"com.example.pos.OrderPlaced": 18, "com.example.pos.PaymentCaptured": 18}, types)
	require.Len(t, seqs, 36, "36 distinct sequence numbers")
	for seq := 1; seq <= 36; seq++ {
		require.Equal(t, 1, seqs[seq], "event with seq %d applied %d times", seq, seqs[seq])
	}

	// The consumer's database holds both runs' events, each once.
	d, err := outbox.OpenDB(db, outbox.DBOptions{})
	require.NoError(t, err)
	defer d.Close()
	var rows, distinct int
	require.NoError(t, d.QueryRow(`SELECT count(*), count(DISTINCT source || ' ' || id) FROM orders_seen`).Scan(&rows, &distinct))
	require.Equal(t, []int{38, 38}, []int{rows, distinct}, "rows in orders_seen, distinct (source, id)")
}

// process is an example program running in the background.
type process struct {
	name   string
	cmd    *exec.Cmd
	cancel context.CancelFunc
	lines  chan string   // stdout, line by line
	done   chan struct{} // closed when stdout is at EOF
	mu     sync.Mutex
	out    strings.Builder // all of stdout so far
	stderr strings.Builder // read only after exit

	waitOnce sync.Once
	err      error // from cmd.Wait
}

func start(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	p := &process{name: filepath.Base(bin), cancel: cancel, lines: make(chan string, 1024), done: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, bin, args...)
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	t.Cleanup(func() {
		cancel() // kills it if still running (the test failed)
		p.exit()
	})
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default: // nobody is waiting for lines any more
			}
		}
	}()
	return p
}

// waitFor waits until the process prints a line starting with prefix.
func (p *process) waitFor(t *testing.T, prefix string) {
	t.Helper()
	for {
		select {
		case line := <-p.lines:
			if strings.HasPrefix(line, prefix) {
				return
			}
		case <-p.done:
			out := p.stdout()
			if strings.HasPrefix(out, prefix) || strings.Contains(out, "\n"+prefix) {
				return // printed just before the end, still buffered in lines
			}
			t.Fatalf("%s ended without printing %q; stdout:\n%s", p.name, prefix, out)
		}
	}
}

// wait waits for the process to exit 0 and returns its whole stdout.
func (p *process) wait(t *testing.T) string {
	t.Helper()
	err := p.exit()
	t.Logf("%s stdout:\n%sstderr:\n%s", p.name, p.stdout(), p.stderr.String())
	require.NoError(t, err, "%s", p.name)
	return p.stdout()
}

// exit waits for stdout to be read to its end, then for the process.
func (p *process) exit() error {
	p.waitOnce.Do(func() {
		<-p.done
		p.err = p.cmd.Wait()
	})
	return p.err
}

func (p *process) stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}
