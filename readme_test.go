package outbox_test

// README.md is what a newcomer reads first: these tests keep it short and
// keep its Quick start a program that builds and works, so that it cannot
// rot while the API moves under it.

import (
	"bytes"
	"context"
	"errors"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// readmeMaxBytes is the most README.md may hold: ten minutes' reading. The
// detail lives under docs/, linked from it.
const readmeMaxBytes = 15 * 1024

func TestReadmeSize(t *testing.T) {
	fi, err := os.Stat("README.md")
	require.NoError(t, err)
	t.Logf("README.md: %d bytes (at most %d)", fi.Size(), readmeMaxBytes)
	require.LessOrEqual(t, fi.Size(), int64(readmeMaxBytes),
		"README.md has grown past ten minutes' reading: move the detail to docs/ and link it")
}

// firstGoBlock returns the text of the first ```go block in markdown.
func firstGoBlock(t *testing.T, markdown string) string {
	t.Helper()
	_, rest, ok := strings.Cut(markdown, "\n```go\n")
	require.True(t, ok, "README.md has no ```go block")
	code, _, ok := strings.Cut(rest, "\n```\n")
	require.True(t, ok, "README.md's first ```go block is not closed")
	return code + "\n"
}

// lockedBuffer is a bytes.Buffer that a child process writes while the
// test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestReadmeQuickStart builds the README's first Go block as the program
// it says it is, runs it against a broker on a free port (MQTT_BROKER),
// waits for the order's event to arrive, stops the program as a user
// would (SIGINT) and checks that it exits cleanly and left the order and
// its event committed, the event sent.
func TestReadmeQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program (-short: under qemu-user the go tool targets another architecture)")
	}
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH to build the README's program")
	}
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	code := firstGoBlock(t, string(readme))
	require.True(t, strings.HasPrefix(code, "package main\n"),
		"the Quick start (README.md's first Go block) must be a complete program, beginning with package main; it begins:\n%.200s", code)

	formatted, err := format.Source([]byte(code))
	require.NoError(t, err, "the Quick start does not parse")
	require.Equal(t, string(formatted), code, "the Quick start is not gofmt'd")

	src := filepath.Join(t.TempDir(), "main.go")
	require.NoError(t, os.WriteFile(src, []byte(code), 0o600))
	bin := filepath.Join(t.TempDir(), "quickstart")
	buildCtx, cancelBuild := context.WithTimeout(context.Background(), 5*time.Minute) // a cold build compiles SQLite
	defer cancelBuild()
	// Built from this module's directory, so that it imports this outbox.
	out, err := exec.CommandContext(buildCtx, gotool, "build", "-o", bin, src).CombinedOutput()
	require.NoError(t, err, "the README's Quick start does not build:\n%s", out)

	broker := harness.StartMochi(t, harness.MochiOptions{})
	events := make(chan outbox.Event, 16)
	require.NoError(t, broker.Subscribe("stores/#", func(m harness.Message) {
		ev, err := outbox.DecodeEvent(m.Payload)
		if err != nil {
			t.Errorf("an undecodable event on %s: %v", m.Topic, err)
			return
		}
		events <- ev
	}))

	dir := t.TempDir()
	var stdout, stderr lockedBuffer
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "MQTT_BROKER="+broker.URL())
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	waited := false // whether the test has received from exited
	defer func() {
		if !waited {
			_ = cmd.Process.Kill()
			<-exited
		}
		t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}()

	select {
	case ev := <-events:
		require.Equal(t, "/stores/42/tills/7", ev.Source)
		require.Equal(t, "com.example.order.created", ev.Type)
		require.Equal(t, int64(1), ev.Sequence)
		require.JSONEq(t, `{"order":1,"total_cents":1250}`, string(ev.Data))
	case err := <-exited:
		waited = true
		t.Fatalf("the program exited before its event arrived: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the order's event did not reach the broker within 30 s")
	}

	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-exited:
		waited = true
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("the program exited with %v after SIGINT", exit)
		}
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("the program did not stop within 15 s of SIGINT")
	}
	select {
	case ev := <-events:
		t.Fatalf("a second event arrived: %+v", ev)
	default:
	}

	// What it committed: one order, its event sent.
	ctx := context.Background()
	ob, err := outbox.Open(ctx, filepath.Join(dir, "till.db"), outbox.Options{})
	require.NoError(t, err)
	defer ob.Close()
	var orders int
	require.NoError(t, ob.DB().QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, 1, orders)
	st, err := ob.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(0), st.Pending, "pending after the event arrived")
	require.Equal(t, int64(1), st.Sent)
}

// markdownLink is an inline link's target: [text](target).
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// headingAnchor is the anchor GitHub gives a heading: lower case, letters,
// digits, '-' and '_' kept, spaces made '-', the rest dropped.
func headingAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// markdownAnchors returns the anchors of a markdown file's headings,
// outside code blocks.
func markdownAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	text, err := os.ReadFile(file)
	require.NoError(t, err)
	anchors := map[string]bool{}
	code := false
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, "```") {
			code = !code
		}
		if !code && strings.HasPrefix(line, "#") {
			anchors[headingAnchor(strings.TrimLeft(line, "#"))] = true
		}
	}
	return anchors
}

// TestDocsLinks checks that every relative link in README.md and docs/
// leads somewhere: the file exists and, for a markdown file, so does the
// heading the anchor names. Moving a section must move its links.
func TestDocsLinks(t *testing.T) {
	files, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	files = append([]string{"README.md"}, files...)
	for _, file := range files {
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range markdownLink.FindAllStringSubmatch(string(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			resolved := file
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s links to %s, which does not exist", file, target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(resolved, ".md") && !markdownAnchors(t, resolved)[anchor] {
				t.Errorf("%s links to %s, which has no heading for #%s", file, target, anchor)
			}
		}
	}
}
