package walwatch

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// walDB makes a database in WAL mode with an outbox-like table, at path.
func walDB(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, topic TEXT, payload BLOB)`)
	require.NoError(t, err)
}

// insert commits one row on a pool of its own, as another process would.
func insert(t *testing.T, path string, n int) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('shop/1', ?)`, fmt.Sprintf(`{"n":%d}`, n))
	require.NoError(t, err)
}

// holdOpen keeps a connection to path open, so that SQLite keeps the -wal
// and -shm files, as a running application does.
func holdOpen(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	c, err := db.Conn(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.QueryRowContext(context.Background(), `SELECT count(*) FROM outbox`).Scan(new(int)))
}

// TestIndexTellsCommits: the WAL index counts commits, one for each, and
// says pending while a transaction has written frames that no commit
// covers yet (here a transaction larger than its page cache, which SQLite
// spills into the WAL before COMMIT).
func TestIndexTellsCommits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "till.db")
	walDB(t, path)
	holdOpen(t, path)
	idx, err := OpenIndex(path)
	require.NoError(t, err)
	defer idx.Close()
	h, ok := idx.Look()
	require.True(t, ok)
	require.False(t, h.Pending, "nothing under way")
	commits := h.Commits
	again, _ := idx.Look()
	require.Equal(t, commits, again.Commits, "nothing committed")

	insert(t, path, 1)
	h, ok = idx.Look()
	require.True(t, ok)
	after := h.Commits
	require.Equal(t, commits+1, after, "one commit")
	require.False(t, h.Pending)

	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=cache_size(10)")
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	c, err := db.Conn(ctx)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.ExecContext(ctx, `BEGIN IMMEDIATE`)
	require.NoError(t, err)
	big := strings.Repeat("x", 4000)
	for i := 0; i < 200; i++ {
		_, err = c.ExecContext(ctx, `INSERT INTO outbox (topic, payload) VALUES ('shop/1', ?)`, big)
		require.NoError(t, err)
	}
	h, _ = idx.Look()
	require.Equal(t, after, h.Commits, "not committed yet")
	require.True(t, h.Pending, "frames written before the commit")
	_, err = c.ExecContext(ctx, `COMMIT`)
	require.NoError(t, err)
	h, _ = idx.Look()
	require.Equal(t, after+1, h.Commits, "committed")
	require.False(t, h.Pending)
}

// TestWaitPollsWhereItCannotWatch: a watch that cannot subscribe to the
// WAL asks every PollInterval, and an ask that says changed ends the wait.
func TestWaitPollsWhereItCannotWatch(t *testing.T) {
	w := Open(filepath.Join(t.TempDir(), "till.db"), Options{PollInterval: time.Millisecond,
		Subscribe: func(string) (*Subscription, error) { return nil, ErrNoWatch }})
	defer w.Close()
	require.False(t, w.HearsAll(time.Hour))
	asks := 0
	ok := w.Wait(context.Background(), nil, func(context.Context) (bool, bool) { asks++; return asks == 3, true }, func() bool { return false })
	require.True(t, ok)
	require.Equal(t, 3, asks)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.False(t, w.Wait(ctx, nil, func(context.Context) (bool, bool) { return false, true }, func() bool { return false }))
}

// TestNapTimer: an armed gap fires once, however often it is armed again
// before (each arming forgets the last); a disarmed one leaves nothing;
// Close ends its reader (goleak checks the package's goroutines).
func TestNapTimer(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("a timerfd is Linux's")
	}
	n, err := NewNapTimer()
	require.NoError(t, err)
	defer n.Close()
	for i := 0; i < 3; i++ {
		n.Arm(200 * time.Microsecond)
		select {
		case <-n.Fired():
		case <-time.After(5 * time.Second):
			t.Fatal("an armed NapTimer did not fire")
		}
	}
	// Fired and not taken: the next arming forgets it, and a disarmed
	// timer is quiet for as long as a long gap would have taken.
	n.Arm(time.Microsecond)
	require.Eventually(t, func() bool { return len(n.fired) == 1 }, 5*time.Second, time.Millisecond)
	n.Arm(time.Hour)
	require.Empty(t, n.fired, "Arm forgets the value an earlier gap left")
	n.Disarm()
	n.Arm(50 * time.Millisecond)
	n.Disarm()
	select {
	case <-n.Fired():
		t.Fatal("a disarmed NapTimer fired")
	case <-time.After(200 * time.Millisecond):
	}
}

// TestSafetyLooksAligned: the wait for a safety look ends at the next
// multiple of the interval on the wall clock, never later than a whole
// interval from now.
func TestSafetyLooksAligned(t *testing.T) {
	const d = 5 * time.Second
	for range 100 {
		w := UntilAligned(d)
		end := time.Now().Add(w)
		require.Greater(t, w, time.Duration(0))
		require.LessOrEqual(t, w, d)
		require.Less(t, end.UnixNano()%int64(d), int64(10*time.Millisecond), "ends on a multiple of the interval")
	}
	require.Zero(t, UntilAligned(0))
}

// TestWaitKeepsTheIndexAcrossARestart: a WAL started again (here by a
// TRUNCATE checkpoint; a writer that finds the WAL checkpointed does the
// same before its commit counts) gives the index header new salts, and so
// moves data_version, while the commit count stays. A wait told of that
// change keeps trusting the index: it used to take the unmoved count for an
// index that does not show commits, and looked with queries from then on.
func TestWaitKeepsTheIndexAcrossARestart(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inotify is Linux's")
	}
	path := filepath.Join(t.TempDir(), "till.db")
	walDB(t, path)
	holdOpen(t, path)
	insert(t, path, 1)
	idx, err := OpenIndex(path)
	require.NoError(t, err)
	defer idx.Close()
	before, ok := idx.Look()
	require.True(t, ok)

	w := Open(path, Options{SafetyPoll: 50 * time.Millisecond})
	defer w.Close()
	require.NotNil(t, w.idx)
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	defer db.Close()
	asks := 0
	ok = w.Wait(context.Background(), nil, func(context.Context) (bool, bool) {
		asks++
		if asks == 1 { // the ask at entry: nothing yet; now the WAL starts again
			var busy, frames, copied int
			require.NoError(t, db.QueryRow(`PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &frames, &copied))
			require.Zero(t, busy)
			return false, true
		}
		return true, true // as data_version says: the header changed
	}, func() bool { return true })
	require.True(t, ok)
	require.Equal(t, 2, asks)
	after, ok := idx.Look()
	require.True(t, ok)
	require.Equal(t, before.Commits, after.Commits, "no commit")
	require.NotEqual(t, before.Salts, after.Salts, "the WAL started again")
	require.NotNil(t, w.idx, "the index is still trusted")
}
