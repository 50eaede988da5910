package outbox

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	eventually(t, 10*time.Second, "rows deleted", func() bool { return countState(t, ob, "pending") == 0 })

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
