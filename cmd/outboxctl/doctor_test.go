package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/lease"
)

// doctorFinding runs doctor --json with args and returns its exit status,
// its output and its findings by check.
func doctorFindings(t *testing.T, args ...string) (int, doctorJSON, map[string]finding) {
	t.Helper()
	r := ctl(t, append([]string{"doctor", "--json"}, args...)...)
	var out doctorJSON
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &out), "stdout %q stderr %q", r.Stdout, r.Stderr)
	by := map[string]finding{}
	for _, f := range out.Findings {
		by[f.Check] = f
	}
	return r.Code, out, by
}

// closedOutbox is an outbox file with one message sent and what extra
// makes of it, closed, so that nothing but doctor touches the directory.
func closedOutbox(t *testing.T, extra ...string) string {
	t.Helper()
	path, ob := newOutbox(t)
	enqueue(t, ob,
		outbox.Message{Topic: "stores/1/orders", Payload: []byte(`{"order":1}`)},
		outbox.Message{Topic: "stores/1/orders", Payload: []byte(`{"order":2}`)},
		outbox.Message{Topic: "stores/1/orders", Payload: []byte(`{"order":3}`)},
	)
	_, err := ob.DB().Exec(`UPDATE outbox_state SET sent_seq = 3, sent_seq_0 = 3, sent_at = 1000`)
	require.NoError(t, err)
	for _, q := range extra {
		_, err := ob.DB().Exec(q)
		require.NoError(t, err, q)
	}
	require.NoError(t, ob.Close())
	return path
}

// TestDoctorHealthy: a till whose outbox is fine gets exit 0, every check
// said, and no file created or changed; with a broker that answers, a
// connection in words.
func TestDoctorHealthy(t *testing.T) {
	path := closedOutbox(t)
	m := harness.StartMochi(t, harness.MochiOptions{})
	before := dirState(t, filepath.Dir(path))

	code, out, by := doctorFindings(t, "--db", path, "--broker", m.URL())
	require.Equal(t, 0, code, "%+v", out)
	require.True(t, out.OK)
	for _, c := range []string{"integrity", "schema", "wal", "disk", "reserve", "relay", "pending", "dead", "expired", "broker"} {
		require.Contains(t, by, c)
		require.NotEqual(t, levelAct, by[c].Level, "%+v", by[c])
	}
	require.Equal(t, "quick_check: ok", by["integrity"].Found)
	require.Contains(t, by["broker"].Found, "connected to "+m.URL())

	r := ctl(t, "doctor", "--db", path, "--full")
	require.Equal(t, 0, r.Code, r.Stdout+r.Stderr)
	require.Contains(t, r.Stdout, "integrity_check: ok")
	require.Contains(t, r.Stdout, "nothing needs a person")
	require.Equal(t, before, dirState(t, filepath.Dir(path)), "no file created or changed")
}

// TestDoctorNeedsAPerson: dead messages, a broker that refuses the
// password or is not there, a relay whose process is gone with messages
// waiting, a damaged file: each is a finding marked act that says what to
// do, and doctor exits 1 — without creating a file.
func TestDoctorNeedsAPerson(t *testing.T) {
	t.Run("dead messages", func(t *testing.T) {
		path := closedOutbox(t, `UPDATE outbox SET attempts = 5, last_error = 'refused', dead_at = 2000 WHERE seq IN (2, 3)`)
		before := dirState(t, filepath.Dir(path))
		code, out, by := doctorFindings(t, "--db", path)
		require.Equal(t, 1, code)
		require.False(t, out.OK)
		require.Equal(t, levelAct, by["dead"].Level)
		require.Contains(t, by["dead"].Found, "2 messages parked as dead")
		require.Contains(t, by["dead"].Do, "outboxctl list --db "+path+" --state dead")
		r := ctl(t, "doctor", "--db", path)
		require.Equal(t, 1, r.Code)
		require.Contains(t, r.Stdout, "act   dead      2 messages parked as dead")
		require.Contains(t, r.Stderr, "1 finding needs a person")
		require.Equal(t, before, dirState(t, filepath.Dir(path)))
	})
	t.Run("disk nearly full", func(t *testing.T) {
		path := closedOutbox(t)
		// What the file system has is what it has: the threshold moves.
		code, _, by := doctorFindings(t, "--db", path, "--min-free", "9000000000000000000")
		require.Equal(t, 1, code)
		require.Equal(t, levelAct, by["disk"].Level)
		require.Contains(t, by["disk"].Found, "free (nearly full: writes to the outbox fail once it is)")
		require.Contains(t, by["disk"].Do, "free space on this file system")
	})
	t.Run("broker refuses the password", func(t *testing.T) {
		path := closedOutbox(t)
		fb := harness.StartFakeBroker(t, harness.FakeBrokerOptions{Connack: func(_ int, level byte) []byte {
			if level == 5 {
				return []byte{0x20, 3, 0, 0x86, 0}
			}
			return []byte{0x20, 2, 0, 4}
		}})
		code, _, by := doctorFindings(t, "--db", path, "--broker", "tcp://"+fb.Addr(), "--username", "till7")
		require.Equal(t, 1, code)
		require.Equal(t, levelAct, by["broker"].Level)
		require.Contains(t, by["broker"].Found, "cannot connect to tcp://"+fb.Addr())
		require.Contains(t, by["broker"].Found, "user name or password")
		require.Contains(t, by["broker"].Do, "check --username and the password file")
	})
	t.Run("nothing listens", func(t *testing.T) {
		path := closedOutbox(t)
		port, err := harness.FreePort()
		require.NoError(t, err)
		code, _, by := doctorFindings(t, "--db", path, "--broker", "tcp://127.0.0.1:"+strconv.Itoa(port))
		require.Equal(t, 1, code)
		require.Contains(t, by["broker"].Found, "connection refused")
		require.Contains(t, by["broker"].Do, "is the broker running")
	})
	t.Run("relay gone, messages waiting", func(t *testing.T) {
		if _, known := lease.ReadProc(int64(os.Getpid())); !known {
			t.Skip("/proc cannot be read here")
		}
		gone := exec.Command("true")
		require.NoError(t, gone.Run())
		h := lease.ThisHolder()
		path := closedOutbox(t, `INSERT INTO outbox (topic, payload) VALUES ('stores/1/orders', '{"order":4}')`)
		set := func(pid, start int64) {
			ob, err := outbox.Open(t.Context(), path, outbox.Options{})
			require.NoError(t, err)
			_, err = ob.DB().Exec(`INSERT OR REPLACE INTO outbox_lease (name, owner, token, expires_at, host, machine_id, boot_id, pid, pid_start, pid_ns)
				VALUES (?, 'till-relay', 1, 0, ?, ?, ?, ?, ?, ?)`, lease.Name, h.Host, h.MachineID, h.BootID, pid, start, h.PIDNS)
			require.NoError(t, err)
			require.NoError(t, ob.Close())
		}
		set(int64(gone.Process.Pid), 1)
		code, _, by := doctorFindings(t, "--db", path)
		require.Equal(t, 1, code)
		require.Equal(t, levelAct, by["relay"].Level, "%+v", by["relay"])
		require.Contains(t, by["relay"].Found, "held by till-relay, process "+strconv.Itoa(gone.Process.Pid)+" on this host, which is gone")
		require.Contains(t, by["relay"].Do, "start the relay")

		// This test's process stands for a relay that runs.
		set(h.PID, h.PIDStart)
		_, _, by = doctorFindings(t, "--db", path)
		require.Equal(t, levelOK, by["relay"].Level, "%+v", by["relay"])
		require.Contains(t, by["relay"].Found, "process "+strconv.FormatInt(h.PID, 10)+" on this host, running")
	})
	t.Run("damaged file", func(t *testing.T) {
		path, ob := newOutbox(t)
		enqueue(t, ob, outbox.Message{Topic: "t", Payload: bytes.Repeat([]byte("x"), 30000)})
		_, err := ob.DB().Exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
		require.NoError(t, err)
		require.NoError(t, ob.Close())
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		_, err = f.WriteAt(bytes.Repeat([]byte{0xde, 0xad}, 4096), 4096)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		before := dirState(t, filepath.Dir(path))
		r := ctl(t, "doctor", "--db", path)
		require.Equal(t, 1, r.Code, r.Stdout)
		require.True(t, strings.Contains(r.Stdout, "damaged") || strings.Contains(r.Stdout, "corrupt"), r.Stdout)
		require.Contains(t, r.Stdout, "restore a backup")
		require.Equal(t, before, dirState(t, filepath.Dir(path)))
	})
}

// TestDoctorDamagedTable: the application's own table in the outbox's
// file is damaged, which neither Open nor Stats reads: quick_check finds
// it.
func TestDoctorDamagedTable(t *testing.T) {
	path, ob := newOutbox(t)
	db := ob.DB()
	_, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT)`)
	require.NoError(t, err)
	for range 200 {
		_, err = db.Exec(`INSERT INTO orders (note) VALUES (?)`, strings.Repeat("n", 100))
		require.NoError(t, err)
	}
	var root, pageSize int64
	require.NoError(t, db.QueryRow(`SELECT rootpage FROM sqlite_schema WHERE name = 'orders'`).Scan(&root))
	require.NoError(t, db.QueryRow(`PRAGMA page_size`).Scan(&pageSize))
	_, err = db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	require.NoError(t, err)
	require.NoError(t, ob.Close())
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte{0xde, 0xad}, 64), (root-1)*pageSize+8)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	before := dirState(t, filepath.Dir(path))

	for _, args := range [][]string{{}, {"--full"}} {
		code, _, by := doctorFindings(t, append(args, "--db", path)...)
		require.Equal(t, 1, code, "%v", args)
		require.Equal(t, levelAct, by["integrity"].Level, "%v", args)
		require.Contains(t, by["integrity"].Found, "the file is damaged", "%v", args)
		require.NotContains(t, by["integrity"].Found, "\n")
		require.Contains(t, by["integrity"].Do, "restore a backup")
		require.Equal(t, levelOK, by["pending"].Level, "the rest is still read")
	}
	require.Equal(t, before, dirState(t, filepath.Dir(path)))
}
