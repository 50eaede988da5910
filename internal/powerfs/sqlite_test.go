package powerfs_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	_ "modernc.org/sqlite"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// SQLite on the mount: a child process (this test binary, running
// TestSQLiteChild) commits rows one transaction each in WAL mode, with no
// checkpoint, and waits; the parent kills it, cuts the power and opens the
// database. At synchronous=NORMAL a commit does not fsync the WAL, so the
// cut must take some commits away; at FULL none. Either way the database
// must open with integrity_check ok, torn WAL pages or not.

const (
	sqliteEnvDB   = "POWERFS_TEST_SQLITE_DB" // set: TestSQLiteChild acts on this database
	sqliteEnvSync = "POWERFS_TEST_SQLITE_SYNC"
	sqliteRows    = 200
)

func openSQLite(t testing.TB, path string) *sql.DB {
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath())
	require.NoError(t, err)
	db.SetMaxOpenConns(1)
	return db
}

// TestSQLiteChild is the process that is killed. It does nothing unless
// TestSQLiteCut started it.
func TestSQLiteChild(t *testing.T) {
	path := os.Getenv(sqliteEnvDB)
	if path == "" {
		t.Skip("the child of TestSQLiteCut; runs only when started by it")
	}
	die := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "SQLITE CHILD FAILED: %s: %v\n", what, err)
		os.Exit(2)
	}
	ctx := context.Background()
	db := openSQLite(t, path)
	var mode string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode=WAL`).Scan(&mode); err != nil || mode != "wal" {
		die("journal_mode", fmt.Errorf("%q, %v", mode, err))
	}
	// The schema is made durable (FULL, and the directory's fsync, as a
	// device's file system does within seconds): only the rows are the
	// experiment.
	for _, q := range []string{
		`PRAGMA synchronous=FULL`,
		`PRAGMA wal_autocheckpoint=0`,
		`CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, v TEXT NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			die(q, err)
		}
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		die("open dir", err)
	}
	if err := d.Sync(); err != nil {
		die("sync dir", err)
	}
	d.Close()
	if _, err := db.ExecContext(ctx, `PRAGMA synchronous=`+os.Getenv(sqliteEnvSync)); err != nil {
		die("synchronous", err)
	}
	for i := range sqliteRows {
		if _, err := db.ExecContext(ctx, `INSERT INTO rows (v) VALUES (?)`, strings.Repeat(strconv.Itoa(i), 60)); err != nil {
			die("insert", err)
		}
	}
	fmt.Printf("\ncommitted %d\n", sqliteRows)
	// Killed here; EOF means the parent is gone.
	io.Copy(io.Discard, os.Stdin)
	os.Exit(3)
}

// runSQLiteChild runs TestSQLiteChild on path until it has committed every
// row, then kills it.
func runSQLiteChild(t *testing.T, path, sync string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSQLiteChild$", "-test.v")
	cmd.Env = append(os.Environ(), sqliteEnvDB+"="+path, sqliteEnvSync+"="+sync)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	committed := make(chan bool, 1)
	var out strings.Builder
	go func() {
		sc := bufio.NewScanner(stdout)
		found := false
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if sc.Text() == fmt.Sprintf("committed %d", sqliteRows) && !found {
				found = true
				committed <- true
			}
		}
		if !found {
			committed <- false
		}
	}()
	var ok bool
	select {
	case ok = <-committed:
	case <-time.After(2 * time.Minute):
	}
	require.NoError(t, cmd.Process.Kill())
	err = cmd.Wait() // after the reader is done with stdout, or it returned
	require.True(t, ok, "the child did not commit its rows (%v):\n%s%s", err, out.String(), stderr.String())
}

// inspect opens the database after a cut and returns its rows, checking
// that they are a prefix of what was committed (WAL recovery stops at the
// first frame that is missing or fails its checksum).
func inspect(t *testing.T, path string) int {
	t.Helper()
	db := openSQLite(t, path)
	defer db.Close()
	harness.CheckIntegrity(t, db)
	var n, maxID int
	require.NoError(t, db.QueryRow(`SELECT count(*), coalesce(max(id), 0) FROM rows`).Scan(&n, &maxID))
	require.Equal(t, n, maxID, "the rows left are the first ones committed")
	return n
}

// TestSQLiteCut: SQLite's promises hold on the mount, and the cuts bite.
func TestSQLiteCut(t *testing.T) {
	for _, c := range []struct {
		name, sync string
		torn       []uint64 // seeds; none: a whole cut
	}{
		{name: "FULL", sync: "FULL"},
		{name: "NORMAL", sync: "NORMAL"},
		{name: "FULL_torn", sync: "FULL", torn: []uint64{1}},
		{name: "NORMAL_torn", sync: "NORMAL", torn: []uint64{1, 2, 3, 4}},
	} {
		t.Run(c.name, func(t *testing.T) {
			seeds := c.torn
			if seeds == nil {
				seeds = []uint64{0}
			}
			for _, seed := range seeds {
				fs, _ := start(t)
				path := filepath.Join(fs.Mountpoint(), "till.db")
				runSQLiteChild(t, path, c.sync)
				var dropped int64
				if c.torn != nil {
					dropped = fs.CutTorn(seed)
				} else {
					dropped = fs.Cut()
				}
				n := inspect(t, path)
				t.Logf("synchronous=%s seed %d: %d of %d commits left after the cut, %d unsynced bytes dropped, integrity_check ok",
					c.sync, seed, n, sqliteRows, dropped)
				if c.sync == "FULL" {
					require.Equal(t, sqliteRows, n, "at FULL a commit is durable")
				} else {
					require.Less(t, n, sqliteRows, "at NORMAL a cut takes unsynced commits away")
					require.Positive(t, dropped)
				}
				fs.Close()
			}
		})
	}
}
