package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/cli/clitest"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// binary is outboxctl built once for all tests (clitest.Main): every
// subcommand is exercised as an operator runs it.
var binary string

func TestMain(m *testing.M) { os.Exit(clitest.Main(m, &binary)) }

func ctl(t *testing.T, args ...string) clitest.Result {
	t.Helper()
	return clitest.Run(t, binary, args...)
}

// newOutbox creates an outbox file with some messages: pending, sent, dead.
func newOutbox(t *testing.T) (path string, ob *outbox.Outbox) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "till.db")
	ob, err := outbox.Open(context.Background(), path, outbox.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	return path, ob
}

// openCreated opens path as a plain-SQL writer would, once the relay
// started on it (its log in logs) has created the schema; closed when the
// test ends.
func openCreated(t *testing.T, path string, logs *harness.LogBuffer) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.True(t, harness.WaitFor(10*time.Second, func() bool {
		_, err := db.Exec(`SELECT 1 FROM outbox LIMIT 1`)
		return err == nil
	}), "schema never created: %s", logs.String())
	return db
}

func enqueue(t *testing.T, ob *outbox.Outbox, msgs ...outbox.Message) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }))
}

func TestHelpHasExamples(t *testing.T) {
	for _, sub := range []string{"relay", "init", "status", "list", "requeue", "purge", "doctor"} {
		r := ctl(t, sub, "--help")
		require.Equal(t, 0, r.Code, sub)
		require.Contains(t, r.Stdout, "Examples:", sub)
		require.Contains(t, r.Stdout, "outboxctl "+sub, sub)
	}
	r := ctl(t, "--help")
	require.Equal(t, 0, r.Code)
	require.Contains(t, r.Stdout, "Examples:")
}

func TestInit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new.db")
	r := ctl(t, "init", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, fmt.Sprintf("outbox schema version %d (new file)", outbox.SchemaVersion))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	r = ctl(t, "init", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, fmt.Sprintf("outbox schema version %d (existing file)", outbox.SchemaVersion))
}

func TestBadDatabases(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.db")
	junk := filepath.Join(dir, "junk.db")
	require.NoError(t, os.WriteFile(junk, bytes.Repeat([]byte("not sqlite "), 500), 0o600))
	plain := filepath.Join(dir, "plain.db")
	db, err := sql.Open("sqlite", plain)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY)`)
	require.NoError(t, err)
	db.Close()
	newer, ob := newOutbox(t)
	_, err = ob.DB().Exec(`INSERT INTO outbox_schema (version) VALUES (99)`)
	require.NoError(t, err)
	ob.Close()
	corrupt, ob := newOutbox(t)
	enqueue(t, ob, outbox.Message{Topic: "t", Payload: bytes.Repeat([]byte("x"), 30000)})
	_, err = ob.DB().Exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	require.NoError(t, err)
	ob.Close()
	f, err := os.OpenFile(corrupt, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte{0xde, 0xad}, 4096), 4096)
	require.NoError(t, err)
	f.Close()

	for _, cmd := range [][]string{{"status"}, {"list"}, {"requeue", "--all-dead"}, {"purge", "--dead"}} {
		for _, c := range []struct {
			path, want string
		}{
			{missing, "no such file"},
			{junk, "is not a SQLite database"},
			{plain, "has no outbox (create one with: outboxctl init"},
			{newer, "schema version 99"},
			{corrupt, "is corrupt"},
			{dir, "is a directory"},
		} {
			args := append(append([]string{}, cmd...), "--db", c.path)
			r := ctl(t, args...)
			require.Equal(t, 1, r.Code, "%v", args)
			require.Contains(t, r.Stderr, c.want, "%v", args)
			require.Equal(t, 1, strings.Count(strings.TrimSpace(r.Stderr), "\n")+1, "one line: %q", r.Stderr)
		}
	}
	_, err = os.Stat(missing)
	require.ErrorIs(t, err, os.ErrNotExist, "status and list never create a database")
	var mode string
	db, err = sql.Open("sqlite", plain)
	require.NoError(t, err)
	require.NoError(t, db.QueryRow(`PRAGMA journal_mode`).Scan(&mode))
	db.Close()
	require.Equal(t, "delete", mode, "a foreign file is left as it was")
}

// TestPathErrorsSayWhatToDo: init, status and relay say what is wrong with
// --db and what to do: the directory missing (init said "no such file"), a
// directory (init and relay said "cannot be written: open DIR: is a
// directory"), a table named outbox that is not an outbox's (status said
// "create one with: outboxctl init", and init then failed with "SQL logic
// error: table outbox already exists"). Nothing is created.
func TestPathErrorsSayWhatToDo(t *testing.T) {
	dir := t.TempDir()
	foreign := filepath.Join(dir, "foreign.db")
	db, err := sql.Open("sqlite", foreign)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE outbox (id INTEGER PRIMARY KEY, body TEXT)`)
	require.NoError(t, err)
	db.Close()
	missing := filepath.Join(dir, "nonexistent", "x.db")
	for _, cmd := range [][]string{{"init"}, {"status"}, {"relay", "--broker", "tcp://127.0.0.1:1", "--stats-interval", "0"}} {
		for _, c := range []struct{ path, want string }{
			{missing, missing + ": the directory " + filepath.Dir(missing) + " does not exist (create it first, or give another --db)"},
			{dir, dir + " is a directory: --db takes the database file, e.g. " + filepath.Join(dir, "till.db")},
			{foreign, foreign + ": this database has a table named outbox that is not an outbox's (no outbox_schema table): use another file, or rename that table"},
		} {
			args := append(append([]string{}, cmd...), "--db", c.path)
			r := ctl(t, args...)
			require.Equal(t, 1, r.Code, "%v: %s", args, r.Stderr)
			require.Equal(t, "outboxctl: "+c.want+"\n", r.Stderr, "%v", args)
		}
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "nothing created beside foreign.db")
}

// TestUnknownCommandNamed: an unknown command is named, with the
// suggestion, on one line that reads as a sentence, even when a command's
// flag follows it ("stat --db x" said "unknown flag: --db"; "statuss" said
// `unknown command "statuss" for "outboxctl" Did you mean this? status`).
func TestUnknownCommandNamed(t *testing.T) {
	for args, want := range map[string]string{
		"stat --db x":                  `unknown command "stat" (did you mean status?); see outboxctl --help`,
		"statuss":                      `unknown command "statuss" (did you mean status?); see outboxctl --help`,
		"--log-level debug lst --db x": `unknown command "lst" (did you mean list?); see outboxctl --help`,
		"bogus --db x":                 `unknown command "bogus"; see outboxctl --help`,
		"--bogus":                      `unknown flag: --bogus`,
		"status --db x --bogus":        `unknown flag: --bogus`,
		"help statuss":                 `unknown command "statuss" (did you mean status?); see outboxctl --help`,
	} {
		r := ctl(t, strings.Fields(args)...)
		require.Equal(t, 2, r.Code, args)
		require.Equal(t, "outboxctl: "+want+"\n", r.Stderr, args)
	}
}

func TestUsageErrors(t *testing.T) {
	path, _ := newOutbox(t)
	for _, args := range [][]string{
		{"status"},
		{"list", "--db", path, "--state", "lost"},
		{"list", "--db", path, "--limit", "0"},
		{"requeue", "--db", path},
		{"requeue", "--db", path, "--id", "x", "--all-dead"},
		{"requeue", "--db", path, "--all-dead", "--all-expired"},
		{"purge", "--db", path},
		{"purge", "--db", path, "--dead", "--sent-before", "1h"},
		{"relay", "--db", path},
		{"relay", "--db", path, "--broker", "http://127.0.0.1:1"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--envelope", "xml"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--window", "0"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--mqtt-version", "3"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--compress", "lz4"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--batch-max-events", "-1"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--batch-max-events", "65536"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--batch-max-bytes", "16777217"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--batch-max-bytes", "64KiB"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--batch-max-delay", "2m"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--ca-file", "/etc/hostname"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--topic-prefix", "acme/#"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--username", "u", "--password-env", "OUTBOXCTL_TEST_UNSET"},
		{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--username", "u", "--password-file", "/nonexistent"},
		{"status", "--db", path, "--bogus"},
		{"status", "--db", path, "extra"},
		{"bogus"},
		{"--log-level", "loud", "status", "--db", path},
		// Told apart by type, not by cobra's message text.
		{"status", "--db"},
		{"stauts", "--db", path},
		{"completion", "bash", "extra"},
		{"help", "bogus"},
		{"init", "--db", path, "--max-pending-messages", "many"},
	} {
		r := ctl(t, args...)
		require.Equal(t, 2, r.Code, "%v: %s", args, r.Stderr)
		require.True(t, strings.HasPrefix(r.Stderr, "outboxctl: "), "%v: %q", args, r.Stderr)
	}
}

// TestRelayMQTTVersionFlag: a bad --mqtt-version is a usage error before
// anything is written: no database file appears.
func TestRelayMQTTVersionFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "never.db")
	r := ctl(t, "relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--mqtt-version", "v5")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "--mqtt-version")
	require.Contains(t, r.Stderr, "auto, 5 or 3.1.1")
	_, err := os.Stat(path)
	require.True(t, os.IsNotExist(err), "nothing written")
	// "4", 3.1.1's protocol level, is accepted: the help says so.
	r = ctl(t, "relay", "--help")
	require.Contains(t, r.Stdout, "3.1.1 (also written 4, its protocol level)")
}

// TestFailedStartCreatesNothing: a relay that cannot start (the metrics
// port in use, a TLS file missing, a bad broker URL) says why and leaves no
// file behind; it created the database and its 1 MiB -reserve before
// finding the port in use.
func TestFailedStartCreatesNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "till.db")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--broker", "tcp://127.0.0.1:1", "--metrics-listen", busy.Addr().String()}, 1, "--metrics-listen: listen tcp " + busy.Addr().String() + ": bind: address already in use"},
		{[]string{"--broker", "ssl://127.0.0.1:1", "--ca-file", filepath.Join(dir, "missing-ca.pem")}, 2, "missing-ca.pem: no such file or directory"},
		{[]string{"--broker", "127.0.0.1:1883"}, 2, "has no scheme: write tcp://127.0.0.1:1883"},
		{[]string{"--broker", "tcp://127.0.0.1:99999"}, 2, "port 99999 is not 1 to 65535"},
	} {
		r := ctl(t, append([]string{"relay", "--db", path, "--stats-interval", "0"}, c.args...)...)
		require.Equal(t, c.code, r.Code, "%v: %s", c.args, r.Stderr)
		require.Contains(t, r.Stderr, c.want, c.args)
		left, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Empty(t, left, "%v: a failed start leaves no file", c.args)
	}
}

func TestStatusListRequeuePurge(t *testing.T) {
	path, ob := newOutbox(t)
	enqueue(t, ob,
		outbox.Message{Topic: "stores/1/orders", Type: "order.created", Payload: []byte(`{"order":1}`)},
		outbox.Message{Topic: "stores/1/orders", Payload: []byte(`{"order":2}`)},
		outbox.Message{Topic: "stores/1/orders", Payload: []byte(`{"order":3}`)},
		outbox.Message{Topic: "stores/1/orders", Payload: []byte(`secret card data`)},
	)
	db := ob.DB()
	// What a relay leaves: seq 1 sent, 2 and 3 dead.
	_, err := db.Exec(`UPDATE outbox_state SET sent_seq = 1, sent_seq_0 = 1, sent_at = 1000`)
	require.NoError(t, err)
	_, err = db.Exec(`UPDATE outbox SET attempts = 5, last_error = 'refused', dead_at = 2000 WHERE seq IN (2, 3)`)
	require.NoError(t, err)

	r := ctl(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
	for _, k := range []string{"db", "schema_version", "pending", "pending_bytes", "oldest_pending_at", "oldest_pending_age_seconds",
		"dead", "sent", "max_pending_messages", "max_pending_bytes", "lease_owner", "lease_expires_at", "file_bytes", "wal_bytes"} {
		require.Contains(t, st, k)
	}
	require.EqualValues(t, 1, st["pending"])
	require.EqualValues(t, 16, st["pending_bytes"])
	require.EqualValues(t, 2, st["dead"])
	require.EqualValues(t, 1, st["sent"])
	require.EqualValues(t, outbox.SchemaVersion, st["schema_version"])
	require.Greater(t, st["file_bytes"], 0.0)

	r = ctl(t, "status", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "pending         1 messages, 16 B")
	require.Contains(t, r.Stdout, "relay lease     free")

	// An idle relay lets its lease lapse (docs/delivery.md).
	for expires, want := range map[int64]string{
		time.Now().Add(time.Hour).UnixMilli(): "relay lease     till-1, until ",
		1000:                                  "relay lease     till-1, lapsed at 1970-01-01T00:00:01Z (the relay is idle, or gone)",
	} {
		_, err = db.Exec(`INSERT INTO outbox_lease (name, owner, token, expires_at) VALUES ('relay', 'till-1', 1, ?)
			ON CONFLICT (name) DO UPDATE SET expires_at = excluded.expires_at`, expires)
		require.NoError(t, err)
		r = ctl(t, "status", "--db", path)
		require.Equal(t, 0, r.Code, r.Stderr)
		require.Contains(t, r.Stdout, want)
	}
	_, err = db.Exec(`DELETE FROM outbox_lease`)
	require.NoError(t, err)

	r = ctl(t, "list", "--db", path, "--state", "dead", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var recs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &recs))
	require.Len(t, recs, 2)
	require.EqualValues(t, 2, recs[0]["seq"])
	require.Equal(t, "refused", recs[0]["last_error"])
	require.EqualValues(t, 5, recs[0]["attempts"])
	require.NotContains(t, recs[0], "payload_base64", "no payload unless asked")
	deadID := recs[0]["id"].(string)

	r = ctl(t, "list", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotContains(t, r.Stdout, "secret card data", "payloads only with --payload")
	require.Contains(t, r.Stdout, "SEQ")
	r = ctl(t, "list", "--db", path, "--payload")
	require.Contains(t, r.Stdout, "secret card data")
	r = ctl(t, "list", "--db", path, "--payload", "--json")
	require.Contains(t, r.Stdout, `"payload_base64"`)

	// An unknown id changes nothing, even beside a valid one.
	r = ctl(t, "requeue", "--db", path, "--id", deadID, "--id", "no-such-id")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, `no message with id "no-such-id"`)
	r = ctl(t, "status", "--db", path, "--json")
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
	require.EqualValues(t, 2, st["dead"])
	// A message that is not dead is refused too.
	r = ctl(t, "requeue", "--db", path, "--id", recsOf(t, path, "pending")[0])
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "not dead")

	r = ctl(t, "requeue", "--db", path, "--id", deadID)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "requeued 1 message(s)")
	r = ctl(t, "purge", "--db", path, "--dead")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "deleted 1 message(s)")
	r = ctl(t, "purge", "--db", path, "--sent-before", "1h")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "deleted 1 message(s)")
	r = ctl(t, "requeue", "--db", path, "--all-dead")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "requeued 0 message(s)")
	require.Len(t, recsOf(t, path, "pending"), 2, "pending messages are never purged")
}

// TestStatusListRequeueExpired: status counts expired messages apart from
// dead ones, list shows them, and requeue brings them back by id or all at
// once (--all-expired), never with --all-dead.
func TestStatusListRequeueExpired(t *testing.T) {
	path, ob := newOutbox(t)
	enqueue(t, ob,
		outbox.Message{Topic: "stores/1/orders", Payload: []byte(`{"order":1}`), Expiry: time.Minute},
		outbox.Message{Topic: "stores/1/orders", Payload: []byte(`{"order":2}`), Expiry: time.Minute},
		outbox.Message{Topic: "stores/1/orders", Payload: []byte(`{"order":3}`)},
	)
	// What a relay leaves: seq 1 and 2 expired, 3 dead.
	_, err := ob.DB().Exec(`UPDATE outbox SET last_error = 'expired (not published): its expiry ran out 5s before its turn', dead_at = 2000, expired = 1 WHERE seq IN (1, 2)`)
	require.NoError(t, err)
	_, err = ob.DB().Exec(`UPDATE outbox SET attempts = 5, last_error = 'refused', dead_at = 2000 WHERE seq = 3`)
	require.NoError(t, err)

	r := ctl(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
	require.EqualValues(t, 2, st["expired"])
	require.EqualValues(t, 1, st["dead"])
	require.EqualValues(t, 0, st["pending"])
	r = ctl(t, "status", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^expired +2$`, r.Stdout)
	require.Regexp(t, `(?m)^dead +1$`, r.Stdout)

	r = ctl(t, "list", "--db", path, "--state", "expired", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var recs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &recs))
	require.Len(t, recs, 2)
	require.Equal(t, "expired", recs[0]["state"])
	require.Contains(t, recs[0]["last_error"], "not published")
	r = ctl(t, "list", "--db", path, "--state", "expired")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "expired (not published)")
	require.Len(t, recsOf(t, path, "dead"), 1)

	r = ctl(t, "requeue", "--db", path, "--all-dead")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "requeued 1 message(s)")
	require.Len(t, recsOf(t, path, "expired"), 2, "--all-dead leaves expired messages alone")
	r = ctl(t, "requeue", "--db", path, "--id", recs[0]["id"].(string))
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "requeued 1 message(s)")
	r = ctl(t, "requeue", "--db", path, "--all-expired")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "requeued 1 message(s)")
	require.Len(t, recsOf(t, path, "pending"), 3)
	require.Empty(t, recsOf(t, path, "expired"))
	var expiring int
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox WHERE expires_at IS NOT NULL`).Scan(&expiring))
	require.Zero(t, expiring, "requeued without their expiry")
}

func recsOf(t *testing.T, path, state string) []string {
	r := ctl(t, "list", "--db", path, "--state", state, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var recs []struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &recs))
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	return ids
}

func TestReadOnlyFileSystem(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a file system here (needs root): %v %s", err, out)
	}
	defer exec.Command("umount", dir).Run()
	path := filepath.Join(dir, "till.db")
	r := ctl(t, "init", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	out, err := exec.Command("mount", "-o", "remount,ro", dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, args := range [][]string{{"requeue", "--all-dead"}, {"purge", "--dead"}, {"init"}} {
		r := ctl(t, append(args, "--db", path)...)
		require.Equal(t, 1, r.Code, "%v", args)
		require.Contains(t, r.Stderr, "is on a read-only file system", "%v", args)
	}
	// Inspection needs no write, so it works there.
	for _, args := range [][]string{{"status"}, {"list"}} {
		r := ctl(t, append(args, "--db", path)...)
		require.Equal(t, 0, r.Code, "%v: %s", args, r.Stderr)
	}
}

func TestLockedDatabase(t *testing.T) {
	path, ob := newOutbox(t)
	conn, err := ob.DB().Conn(context.Background())
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(context.Background(), `BEGIN IMMEDIATE`)
	require.NoError(t, err)
	defer conn.ExecContext(context.Background(), `ROLLBACK`)
	start := time.Now()
	r := ctl(t, "purge", "--db", path, "--dead", "--timeout", "300ms")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "is locked by another process (waited 300ms")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
}

// stopRelay sends a relay SIGTERM and requires it to exit 0, within 15 s.
func stopRelay(t *testing.T, cmd *exec.Cmd, logs *harness.LogBuffer) {
	t.Helper()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "exit 0 on SIGTERM: %s", logs.String())
	case <-time.After(15 * time.Second):
		t.Fatal("relay did not exit on SIGTERM")
	}
}

// broker is an in-process MQTT broker that records what it routes.
type broker struct {
	addr string
	mu   sync.Mutex
	got  []outbox.Event
}

func startBroker(t *testing.T) *broker {
	m := harness.StartMochi(t, harness.MochiOptions{})
	b := &broker{addr: m.Addr()}
	require.NoError(t, m.Subscribe("shop/#", func(msg harness.Message) {
		ev, err := outbox.DecodeEvent(msg.Payload)
		if err == nil {
			b.mu.Lock()
			b.got = append(b.got, ev)
			b.mu.Unlock()
		}
	}))
	return b
}

func (b *broker) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.got)
}

// TestRelaySidecar runs the relay command with auto (which picks 5 on mochi)
// and with --mqtt-version 3.1.1.
func TestRelaySidecar(t *testing.T) {
	// The 3.1.1 run declares the writer (SQLite's default, FULL) with
	// --writers-full: it publishes with no fsync of the WAL, where the
	// other syncs before each batch.
	for _, v := range []struct {
		flag, speaks string
		writersFull  bool
	}{{"auto", "5", false}, {"3.1.1", "3.1.1", true}} {
		t.Run("mqtt "+v.flag, func(t *testing.T) { testRelaySidecar(t, v.flag, v.speaks, v.writersFull) })
	}
}

func testRelaySidecar(t *testing.T, version, speaks string, writersFull bool) {
	b := startBroker(t)
	path := filepath.Join(t.TempDir(), "shop.db")
	pwFile := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pwFile, []byte("hunter2-secret\n"), 0o600))
	cmd := exec.Command(binary, "relay", "--db", path, "--broker", "tcp://"+b.addr,
		"--client-id", "sidecar-test", "--source", "/shops/9", "--topic-prefix", "shop/9/", "--username", "u", "--password-file", pwFile,
		"--log-format", "json", "--log-level", "debug", "--mqtt-version", version, "--stats-interval", "50ms")
	if writersFull {
		cmd.Args = append(cmd.Args, "--writers-full")
	}
	var stderr harness.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()

	// The relay creates the schema; wait for it, then write as another
	// program would: plain SQL in its own transaction.
	db := openCreated(t, path, &stderr)
	_, err := db.Exec(`CREATE TABLE sales (id INTEGER PRIMARY KEY, amount INTEGER)`)
	require.NoError(t, err)
	for i := 0; i < 20; i++ {
		tx, err := db.Begin()
		require.NoError(t, err)
		_, err = tx.Exec(`INSERT INTO sales (amount) VALUES (?)`, i)
		require.NoError(t, err)
		_, err = tx.Exec(`INSERT INTO outbox (topic, payload) VALUES ('shop/9/sales', ?)`, fmt.Sprintf(`{"sale":%d}`, i))
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
	}
	// Another shop's topic: outside --topic-prefix, parked as dead.
	_, err = db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('shop/8/sales', '{}')`)
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for dead := 0; b.count() < 20 || dead < 1; {
		require.True(t, time.Now().Before(deadline), "not delivered: %s", stderr.String())
		time.Sleep(5 * time.Millisecond)
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL AND topic = 'shop/8/sales'`).Scan(&dead))
	}
	b.mu.Lock()
	require.Len(t, b.got, 20)
	for i, ev := range b.got {
		require.Equal(t, "/shops/9", ev.Source)
		require.Equal(t, int64(i+1), ev.Sequence)
	}
	b.mu.Unlock()
	// The relay's stats line, once it counts the 21 messages settled.
	var stats struct {
		Sent     int64 `json:"sent"`
		WALSyncs int64 `json:"wal_syncs"`
	}
	deadline = time.Now().Add(10 * time.Second)
	for stats.Sent < 20 {
		require.True(t, time.Now().Before(deadline), "no stats line counting 20 sent: %s", stderr.String())
		time.Sleep(10 * time.Millisecond)
		for _, line := range strings.Split(stderr.String(), "\n") {
			if strings.Contains(line, `"msg":"outbox relay stats"`) {
				require.NoError(t, json.Unmarshal([]byte(line), &stats))
			}
		}
	}
	if writersFull {
		require.Zero(t, stats.WALSyncs, "--writers-full: no fsync before publishing (and none for the marks of a trickle)")
	} else {
		require.Positive(t, stats.WALSyncs, "the writer's commits are synced before publishing")
	}
	// status, another process, says which version the relay speaks.
	r := ctl(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
	require.Equal(t, "MQTT "+speaks, st["protocol"], "mochi speaks both; auto chooses 5")
	r = ctl(t, "status", "--db", path)
	require.Regexp(t, `protocol\s+MQTT `+regexp.QuoteMeta(speaks)+`\n`, r.Stdout)

	stopRelay(t, cmd, &stderr)
	logs := stderr.String()
	require.Contains(t, logs, `"msg":"outbox relay connected"`)
	require.Contains(t, logs, `"protocol":"`+speaks+`"`)
	require.NotContains(t, logs, "hunter2", "the password is never logged")
	var pending int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM outbox_messages WHERE state = 'pending'`).Scan(&pending))
	require.Zero(t, pending)
}

// oldSchema creates a database at an older schema version from the frozen
// migration files, with one pending message.
func oldSchema(t *testing.T, version int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), fmt.Sprintf("v%d.db", version))
	db, err := outbox.OpenDB(path, outbox.DBOptions{})
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE outbox_schema (version INTEGER NOT NULL, applied_at INTEGER NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	steps, err := filepath.Glob("../../schema/outbox/*.sql")
	require.NoError(t, err)
	for v := 1; v <= version; v++ {
		step, err := os.ReadFile(steps[v-1])
		require.NoError(t, err)
		_, err = db.Exec(string(step))
		require.NoError(t, err, steps[v-1])
		_, err = db.Exec(`INSERT INTO outbox_schema (version) VALUES (?)`, v)
		require.NoError(t, err)
	}
	_, err = db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('stores/1/orders', '{"order":1}')`)
	require.NoError(t, err)
	return path
}

// dirState is every file in dir with its size and a hash of its content.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		out[e.Name()] = fmt.Sprintf("%d %x", len(b), sha256.Sum256(b))
	}
	return out
}

// TestInspectionWritesNothing: status and list used to migrate the schema
// (under an older relay still running on the file) and to write the disk
// reserve, although their help says they never change a database.
func TestInspectionWritesNothing(t *testing.T) {
	inspections := [][]string{{"status"}, {"status", "--json"}, {"list"}, {"list", "--state", "dead", "--json"}, {"list", "--commands"}, {"list", "--commands", "--json"}}
	t.Run("this schema", func(t *testing.T) {
		path, ob := newOutbox(t)
		enqueue(t, ob, outbox.Message{Topic: "stores/1/orders", Payload: []byte(`{"order":1}`)})
		require.NoError(t, ob.Close())
		require.NoError(t, os.Remove(path+"-reserve"))
		before := dirState(t, filepath.Dir(path))
		for _, args := range inspections {
			r := ctl(t, append(args, "--db", path)...)
			require.Equal(t, 0, r.Code, "%v: %s", args, r.Stderr)
		}
		require.Equal(t, before, dirState(t, filepath.Dir(path)), "no file created or changed")
	})
	t.Run("the schema before", func(t *testing.T) {
		path := oldSchema(t, outbox.SchemaVersion-1)
		before := dirState(t, filepath.Dir(path))
		for _, args := range inspections {
			r := ctl(t, append(args, "--db", path)...)
			require.Equal(t, 0, r.Code, "%v: %s", args, r.Stderr)
		}
		r := ctl(t, "status", "--db", path, "--json")
		var st map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
		require.EqualValues(t, outbox.SchemaVersion-1, st["schema_version"], "read as it is")
		require.EqualValues(t, 1, st["pending"])
		require.Len(t, st["priorities"], 1, "everything at priority 0")
		require.Equal(t, map[string]any{"priority": 0.0, "pending": 1.0}, map[string]any{
			"priority": st["priorities"].([]any)[0].(map[string]any)["priority"], "pending": st["priorities"].([]any)[0].(map[string]any)["pending"]})
		r = ctl(t, "list", "--db", path, "--priority", "0", "--json")
		require.Equal(t, 0, r.Code, r.Stderr)
		require.Contains(t, r.Stdout, `"priority": 0`)
		r = ctl(t, "list", "--db", path, "--priority", "9", "--json")
		require.Equal(t, 0, r.Code, r.Stderr)
		require.Equal(t, "[]\n", r.Stdout)
		require.Equal(t, map[string]any{"waiting": 0.0, "applied": 0.0, "expired": 0.0, "failed": 0.0, "malformed": 0.0}, st["commands"], "no commands table yet: none")
		r = ctl(t, "list", "--db", path, "--commands", "--json")
		require.Equal(t, 0, r.Code, r.Stderr)
		require.Equal(t, "[]\n", r.Stdout)
		require.Equal(t, before, dirState(t, filepath.Dir(path)), "not migrated, nothing written")
	})
	t.Run("an older schema", func(t *testing.T) {
		path := oldSchema(t, 1)
		before := dirState(t, filepath.Dir(path))
		for _, args := range inspections {
			r := ctl(t, append(args, "--db", path)...)
			require.Equal(t, 1, r.Code, "%v", args)
			require.Contains(t, r.Stderr, "outboxctl init --db "+path+" migrates it", "%v", args)
			require.Equal(t, 1, strings.Count(strings.TrimSpace(r.Stderr), "\n")+1, "one line: %q", r.Stderr)
		}
		require.Equal(t, before, dirState(t, filepath.Dir(path)))
		r := ctl(t, "init", "--db", path)
		require.Equal(t, 0, r.Code, r.Stderr)
		r = ctl(t, "status", "--db", path, "--json")
		require.Equal(t, 0, r.Code, r.Stderr)
	})
}

func TestInitSetsLimits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "till.db")
	r := ctl(t, "init", "--db", path, "--max-pending-messages", "5", "--max-pending-bytes", "1000")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "limits: 5 messages, 1000 B, payloads up to 256.0 KiB")
	r = ctl(t, "init", "--db", path, "--max-pending-bytes", "-1", "--max-payload-bytes", "3")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "limits: 5 messages, payloads up to 3 B\n", "0 keeps, negative removes")
	r = ctl(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
	require.EqualValues(t, 5, st["max_pending_messages"])
	require.EqualValues(t, 0, st["max_pending_bytes"])
	r = ctl(t, "status", "--db", path)
	require.Contains(t, r.Stdout, "limits          5 messages")
	// Plain SQL is held to the stored limit.
	db, err := outbox.OpenDB(path, outbox.DBOptions{})
	require.NoError(t, err)
	defer db.Close()
	for i := 0; i < 5; i++ {
		_, err = db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('t', 'x')`)
		require.NoError(t, err)
	}
	_, err = db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('t', 'x')`)
	require.ErrorContains(t, err, "outbox full: pending limit reached")
	// And to the stored payload limit.
	_, err = db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('t', 'four')`)
	require.ErrorContains(t, err, "outbox: payload too large")
}

// TestRelaySeveralBrokers: --broker repeats (a cluster's nodes). It used to
// keep only the last one: here the last is a dead address, and the events
// still arrive, through the live one.
func TestRelaySeveralBrokers(t *testing.T) {
	b := startBroker(t)
	path := filepath.Join(t.TempDir(), "shop.db")
	cmd := exec.Command(binary, "relay", "--db", path, "--broker", "tcp://"+b.addr, "--broker", "tcp://127.0.0.1:1",
		"--client-id", "brokers-test", "--log-format", "json")
	var stderr harness.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	db := openCreated(t, path, &stderr)
	for i := range 5 {
		_, err := db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('shop/sales', ?)`, fmt.Sprintf(`{"sale":%d}`, i))
		require.NoError(t, err)
	}
	require.True(t, harness.WaitFor(20*time.Second, func() bool { return b.count() == 5 }), "not delivered: %s", stderr.String())
	require.Contains(t, stderr.String(), `"broker":"tcp://`+b.addr+`"`, "the log says which address it is on")
}

// TestStatusSaysWhatTheBrokerSays: while the lease holder records that the
// broker says it cannot take messages, status says it, since when, in text
// and JSON; null otherwise. The same for the messages the broker took with
// no subscriber.
func TestStatusSaysWhatTheBrokerSays(t *testing.T) {
	path, ob := newOutbox(t)
	db := ob.DB()
	since := time.Now().Add(-3 * time.Minute).Truncate(time.Millisecond)
	_, err := db.Exec(`INSERT INTO outbox_lease (name, owner, token, expires_at) VALUES ('relay', 'till-1', 1, ?)`,
		time.Now().Add(time.Hour).UnixMilli())
	require.NoError(t, err)
	r := ctl(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
	require.Contains(t, st, "broker_unavailable")
	require.Nil(t, st["broker_unavailable"])

	_, err = db.Exec(`UPDATE outbox_lease SET broker_says = 'the broker says quota exceeded (0x97)', broker_says_since = ?`, since.UnixMilli())
	require.NoError(t, err)
	r = ctl(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
	require.Equal(t, "the broker says quota exceeded (0x97)", st["broker_unavailable"])
	require.Equal(t, since.UTC().Format(time.RFC3339Nano), st["broker_unavailable_since"])
	r = ctl(t, "status", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "broker          the broker says quota exceeded (0x97), since "+since.UTC().Format(time.RFC3339)+" (3m")
	require.NotContains(t, r.Stdout, "no subscriber")
	require.EqualValues(t, 0, st["no_subscribers"])
	require.Nil(t, st["no_subscribers_topic"])

	// And what the broker took with no subscriber.
	_, err = db.Exec(`UPDATE outbox_lease SET no_subscribers = 12, no_subscribers_topic = 'stores/42/orders', no_subscribers_at = ?`, since.UnixMilli())
	require.NoError(t, err)
	r = ctl(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
	require.EqualValues(t, 12, st["no_subscribers"])
	require.Equal(t, "stores/42/orders", st["no_subscribers_topic"])
	require.Equal(t, since.UTC().Format(time.RFC3339Nano), st["no_subscribers_at"])
	r = ctl(t, "status", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "no subscriber   12 messages reached the broker with no subscriber, last on stores/42/orders at "+since.UTC().Format(time.RFC3339))
}
