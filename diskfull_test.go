package outbox

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/reserve"
)

// smallFileSystem mounts a tmpfs of the given size on a temporary directory
// and reports whether it could; without root it cannot, and the caller falls
// back to SQLite's max_page_count.
func smallFileSystem(t *testing.T, size string) (dir string, ok bool) {
	dir = t.TempDir()
	if os.Getenv("OUTBOX_TEST_NO_MOUNT") != "" {
		t.Log("OUTBOX_TEST_NO_MOUNT is set; using max_page_count")
		return dir, false
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Logf("cannot mount a tmpfs (%v: %s); using max_page_count instead", err, out)
		return dir, false
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir, true
}

// TestFullDisk fills the file system under the database: enqueue fails with
// ErrDiskFull and the business transaction rolls back, the relay keeps
// draining, and once space is free again writes resume; nothing committed is
// lost and the file stays intact.
func TestFullDisk(t *testing.T) {
	ctx := context.Background()
	dir, mounted := smallFileSystem(t, "3m")
	path := filepath.Join(dir, "till.db")
	var ob *Outbox
	if mounted {
		var err error
		ob, err = Open(ctx, path, Options{Logger: testLogger()})
		require.NoError(t, err)
	} else {
		// The fallback: every connection of the pool gets a page limit,
		// which SQLite reports exactly as a full disk (SQLITE_FULL).
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=max_page_count(700)&_txlock=immediate")
		require.NoError(t, err)
		defer db.Close()
		ob, err = New(ctx, db, Options{Logger: testLogger(), ReserveBytes: -1})
		require.NoError(t, err)
	}
	defer ob.Close()
	_, err := ob.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	require.NoError(t, err)
	t.Logf("full disk simulated with: %s", map[bool]string{true: "a 3 MiB tmpfs", false: "max_page_count"}[mounted])

	pub := &fakePublisher{connErr: errors.New("broker unreachable")} // offline while the disk fills
	opts := fastRelay()
	opts.Retention = -1 // sent rows are deleted at once, so draining frees space
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)

	payload := make([]byte, 16<<10)
	committed := 0
	var fullErr error
	for i := 0; i < 1000 && fullErr == nil; i++ {
		fullErr = ob.Transact(ctx, func(tx *sql.Tx) error {
			if _, err := tx.Exec(`INSERT INTO orders (item) VALUES (?)`, "order-"+strconv.Itoa(i)); err != nil {
				return err
			}
			return ob.Enqueue(ctx, tx, Message{Topic: "pos/orders", Payload: payload})
		})
		if fullErr == nil {
			committed++
		}
	}
	require.ErrorIs(t, fullErr, ErrDiskFull, "a full disk is reported as such")
	require.Greater(t, committed, 10)
	t.Logf("disk full after %d orders of %d KiB", committed, len(payload)>>10)
	var orders int
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, committed, orders, "the failed order rolled back with its event")
	require.Equal(t, committed, countState(t, ob, "pending"))

	// The broker comes back: the relay drains, which frees space.
	pub.mu.Lock()
	pub.connErr = nil
	pub.mu.Unlock()
	r.ReconnectNow()
	eventually(t, 20*time.Second, "backlog drained", func() bool { return pub.publishedCount() == committed })
	// The marks wait for syncs and space; under a loaded CI runner 10 s
	// once ran out (all published, marks still under way).
	eventually(t, 30*time.Second, "rows deleted", func() bool { return countState(t, ob, "pending") == 0 })

	// Writes resume.
	var resumeErr error
	eventually(t, 10*time.Second, "writes resume", func() bool {
		resumeErr = ob.Transact(ctx, func(tx *sql.Tx) error {
			if _, err := tx.Exec(`INSERT INTO orders (item) VALUES ('after')`); err != nil {
				return err
			}
			return ob.Enqueue(ctx, tx, Message{Topic: "pos/orders", Payload: payload})
		})
		return resumeErr == nil
	})
	eventually(t, 10*time.Second, "sent", func() bool { return pub.publishedCount() == committed+1 })
	var check string
	require.NoError(t, ob.DB().QueryRow(`PRAGMA integrity_check`).Scan(&check))
	require.Equal(t, "ok", check)
	require.Zero(t, countState(t, ob, "dead"))
}

// fillDisk writes a file in dir until the file system has no room left, as
// another program on the device would.
func fillDisk(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err = f.Write(buf); err != nil {
			break
		}
	}
	require.ErrorIs(t, err, syscall.ENOSPC)
	// Blocks smaller than the buffer may still be free: fill them too.
	for err == nil || errors.Is(err, syscall.ENOSPC) {
		if _, err = f.Write(buf[:512]); err != nil {
			break
		}
	}
	require.ErrorIs(t, err, syscall.ENOSPC)
	free, _ := reserve.FreeBytes(filepath.Join(dir, "x"))
	require.Zero(t, free, "the disk is full")
}

// TestFullDiskIdleRelayKeepsLease: the relay is idle (the broker is away)
// when another program fills the disk. Its lease renewals fail with
// SQLITE_FULL: the relay must spend the reserve on them, say "disk full",
// keep its lease, and deliver the backlog once the broker is back, while the
// disk stays full. Every renewal appends a page to the WAL, so the second
// case keeps the disk full for more renewals than the reserve has room for.
func TestFullDiskIdleRelayKeepsLease(t *testing.T) {
	t.Run("default reserve", func(t *testing.T) {
		fullDiskIdle(t, 0, fastRelay().LeaseTTL, 3)
	})
	t.Run("renewals outlast the reserve", func(t *testing.T) {
		// 64 KiB hold 16 WAL frames: 40 renewals need 2.5 times that.
		fullDiskIdle(t, 64<<10, 400*time.Millisecond, 40)
	})
}

func fullDiskIdle(t *testing.T, reserveBytes int64, ttl time.Duration, renewals int) {
	ctx := context.Background()
	dir, mounted := smallFileSystem(t, "4m")
	if !mounted {
		t.Skip("needs a small file system of its own (a tmpfs mount) to fill")
	}
	path := filepath.Join(dir, "till.db")
	logs := &harness.LogBuffer{}
	ob, err := Open(ctx, path, Options{ReserveBytes: reserveBytes, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	require.NoError(t, err)
	defer ob.Close()
	_, err = ob.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	require.NoError(t, err)
	const backlog = 40
	for i := range backlog {
		commitOrder(t, ob, "pos/orders", i)
	}

	pub := &fakePublisher{connErr: errors.New("broker unreachable")}
	opts := fastRelay()
	opts.LeaseTTL = ttl
	// Connection attempts far apart, so that the last error is the lease's
	// while the disk is full (ReconnectNow ends the wait below).
	opts.Reconnect = Backoff{Initial: time.Minute, Max: time.Minute}
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	leaseToken := func() (token int64) {
		require.NoError(t, ob.DB().QueryRow(`SELECT token FROM outbox_lease WHERE name = 'relay'`).Scan(&token))
		return token
	}
	eventually(t, 10*time.Second, "the relay holds the lease and tried the broker", func() bool {
		return pub.connectCount() > 0
	})

	// The file holds its pages first (a new file's are all in the WAL), so
	// that the reserve's room goes to renewals' WAL frames, not to a first
	// checkpoint that grows the file by the schema's size.
	_, err = ob.DB().Exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	require.NoError(t, err)
	fillDisk(t, dir)
	const failed = "outbox relay could not renew its lease"
	eventually(t, 10*time.Second, "a lease renewal failed on the full disk", func() bool {
		return strings.Contains(logs.String(), failed)
	})
	// Then past the half TTL after which the relay stops publishing: until
	// renewals have failed three more times, or succeeded often enough.
	after := leaseToken()
	sawDiskFull := false
	eventually(t, 20*time.Second, "renewals fail or go on", func() bool {
		st, err := r.Stats(ctx)
		require.NoError(t, err)
		sawDiskFull = sawDiskFull || strings.Contains(st.LastError, "disk full")
		return strings.Count(logs.String(), failed) >= 4 || leaseToken() >= after+int64(renewals)
	})
	t.Logf("renewals failed: %d; lease token %d -> %d after the first failure; Stats.LastError said disk full: %v",
		strings.Count(logs.String(), failed), after, leaseToken(), sawDiskFull)
	require.True(t, sawDiskFull, "Stats.LastError mentions the full disk while renewals fail")
	require.Contains(t, logs.String(), "disk full", "the log says why")
	require.GreaterOrEqual(t, leaseToken(), after+int64(renewals), "renewals go on while the disk stays full")

	// The broker comes back; the disk stays full.
	pub.mu.Lock()
	pub.connErr = nil
	pub.mu.Unlock()
	r.ReconnectNow()
	eventually(t, 20*time.Second, "the backlog delivered", func() bool { return pub.publishedCount() == backlog })
	eventually(t, 10*time.Second, "the backlog marked sent", func() bool { return countState(t, ob, "pending") == 0 })
	_, err = os.Stat(filepath.Join(dir, "filler"))
	require.NoError(t, err, "the filler is still there")
	free, _ := reserve.FreeBytes(path)
	t.Logf("delivered %d with the filler in place, %d bytes free", backlog, free)
}

// TestFullDiskRestart: a device restarts on a full disk. SQLite must create
// the database's -shm file (its WAL index, 32 KiB) before the first
// statement, and that fails (SQLITE_IOERR_SHMSIZE) while the reserve holds
// the last free space. Open must spend the reserve and try again, and a relay
// then drains the backlog while the disk stays full.
func TestFullDiskRestart(t *testing.T) {
	ctx := context.Background()
	dir, mounted := smallFileSystem(t, "4m")
	if !mounted {
		t.Skip("needs a small file system of its own (a tmpfs mount) to fill")
	}
	path := filepath.Join(dir, "till.db")
	ob, err := Open(ctx, path, Options{Logger: testLogger()})
	require.NoError(t, err)
	_, err = ob.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	require.NoError(t, err)
	const backlog = 40
	for i := range backlog {
		commitOrder(t, ob, "pos/orders", i)
	}
	require.NoError(t, ob.Close())
	_, err = os.Stat(path + "-reserve")
	require.NoError(t, err, "the reserve is on disk")
	_, err = os.Stat(path + "-shm")
	require.ErrorIs(t, err, os.ErrNotExist, "a clean close removes the -shm file")

	fillDisk(t, dir)
	logs := &harness.LogBuffer{}
	ob, err = Open(ctx, path, Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err, "Open on a full disk spends the reserve")
	defer ob.Close()
	require.Contains(t, logs.String(), "disk full", "the log says why the reserve went")
	_, err = os.Stat(path + "-reserve")
	require.ErrorIs(t, err, os.ErrNotExist, "the reserve was spent")

	pub := &fakePublisher{}
	opts := fastRelay()
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 20*time.Second, "the backlog delivered", func() bool { return pub.publishedCount() == backlog })
	eventually(t, 10*time.Second, "the backlog marked sent", func() bool { return countState(t, ob, "pending") == 0 })
	_, err = os.Stat(filepath.Join(dir, "filler"))
	require.NoError(t, err, "the filler is still there")
	var check string
	require.NoError(t, ob.DB().QueryRow(`PRAGMA integrity_check`).Scan(&check))
	require.Equal(t, "ok", check)
}

// TestFullDiskRelayStartsOnFullDisk: a relay started on a database whose
// disk is already full used to fail Run at once ("outbox: lease: database or
// disk is full"): taking the lease is a write, and it may spend the reserve
// like the relay's other writes.
func TestFullDiskRelayStartsOnFullDisk(t *testing.T) {
	ctx := context.Background()
	dir, mounted := smallFileSystem(t, "4m")
	if !mounted {
		t.Skip("needs a small file system of its own (a tmpfs mount, as root)")
	}
	ob, err := Open(ctx, filepath.Join(dir, "till.db"), Options{Logger: testLogger()})
	require.NoError(t, err)
	defer ob.Close()
	for i := 0; i < 20; i++ {
		require.NoError(t, enqueueTopic(ctx, ob, "pos/orders", make([]byte, 1000)))
	}
	fillDisk(t, dir)
	pub := &fakePublisher{}
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 10*time.Second, "drained on the full disk", func() bool { return pub.publishedCount() == 20 })
	st, err := r.Stats(ctx)
	require.NoError(t, err)
	require.Contains(t, st.LastError, "disk full")
}
