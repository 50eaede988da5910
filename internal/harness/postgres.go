package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// PostgresBinDir finds the directory of the newest installed PostgreSQL's
// programs (Debian's /usr/lib/postgresql/<major>/bin, which is not in
// PATH); "" if none is installed.
func PostgresBinDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major first: 9.6 < 10 < 15, by number, not by name.
	major := func(d string) float64 {
		f, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64)
		return f
	}
	sort.Slice(dirs, func(i, j int) bool { return major(dirs[i]) > major(dirs[j]) })
	for _, d := range dirs {
		if executable(filepath.Join(d, "postgres")) && executable(filepath.Join(d, "initdb")) {
			return d
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		if d := filepath.Dir(p); executable(filepath.Join(d, "initdb")) {
			return d
		}
	}
	return ""
}

// PostgresOptions shape a Postgres.
type PostgresOptions struct {
	// BinDir holds postgres, initdb and createdb; "" looks for them
	// (PostgresBinDir).
	BinDir string
	// Config are extra "name=value" server settings, after the harness's
	// own (which they override).
	Config []string
}

// Postgres is one PostgreSQL server owned by a test: a cluster made by
// initdb in a directory of its own (owned by the postgres user when the
// test runs as root: PostgreSQL refuses to run as root), listening on a
// free loopback port and on a unix socket in that directory, stopped by
// PID when the test ends. Its settings are for tests: fsync is off (a
// crash of the machine, not of a process, may lose committed
// transactions), and every local connection is trusted.
type Postgres struct {
	bin, dir, data, log string
	port                int
	cred                *syscall.Credential // nil: run as this process's user
	proc                *process
	databases           atomic.Int64
}

// postgresStopWait is how long an immediate shutdown may take before
// SIGKILL.
const postgresStopWait = 10 * time.Second

// StartPostgres starts a PostgreSQL server that lives as long as tb,
// skipping tb if PostgreSQL is not installed (or, as root, if there is no
// postgres user to run it as). If tb fails, the end of the server's log is
// logged.
func StartPostgres(tb TB, o PostgresOptions) *Postgres {
	tb.Helper()
	if o.BinDir == "" {
		o.BinDir = PostgresBinDir()
	}
	if o.BinDir == "" {
		tb.Skipf("PostgreSQL is not installed (looked in /usr/lib/postgresql/*/bin and PATH): apt-get install -y postgresql")
	}
	pg := &Postgres{bin: o.BinDir}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			tb.Skipf("PostgreSQL refuses to run as root and there is no postgres user to run it as (%v): apt-get install -y postgresql", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		pg.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// Not tb.TempDir(): its parents are private to this user, and the
	// postgres user must reach the directory.
	dir, err := os.MkdirTemp("", "outbox-pg-")
	must(tb, err, "postgres directory")
	pg.dir, pg.data, pg.log = dir, filepath.Join(dir, "data"), filepath.Join(dir, "postgres.log")
	tb.Cleanup(func() { os.RemoveAll(dir) }) // runs after the server's stop (last in, first out)
	if pg.cred != nil {
		must(tb, os.Chown(dir, int(pg.cred.Uid), int(pg.cred.Gid)), "postgres directory")
	}
	// --no-sync: a test's cluster need not survive a power cut.
	if out, err := pg.command(filepath.Join(pg.bin, "initdb"), "-D", pg.data, "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync").CombinedOutput(); err != nil {
		tb.Fatalf("initdb: %v\n%s", err, out)
	}
	settings := append([]string{
		"listen_addresses=127.0.0.1",
		"unix_socket_directories=" + dir,
		"fsync=off", "synchronous_commit=off", "full_page_writes=off",
		"max_connections=200",
	}, o.Config...)
	// The port is free when we look; another process could take it before
	// the server binds it, so a failed start is retried with a new port.
	for attempt := 0; ; attempt++ {
		port, err := FreePort()
		must(tb, err, "free port")
		pg.port = port
		if err = pg.start(settings); err == nil {
			break
		}
		if attempt == 4 {
			tb.Fatalf("postgres did not start: %v\n%s", err, tail(pg.log, 40))
		}
	}
	tb.Cleanup(func() {
		pg.stop(tb)
		if tb.Failed() {
			tb.Logf("postgres log (%s), last lines:\n%s", pg.log, tail(pg.log, 60))
		}
	})
	return pg
}

// command is prog run as the server's user, in its directory.
func (pg *Postgres) command(prog string, args ...string) *exec.Cmd {
	cmd := exec.Command(prog, args...)
	cmd.Dir = pg.dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	cmd.SysProcAttr = childAttr()
	cmd.SysProcAttr.Credential = pg.cred
	return cmd
}

// start runs the postmaster in the foreground (so that it is this
// process's child, known by its PID) and waits, bounded, until it accepts
// connections.
func (pg *Postgres) start(settings []string) error {
	args := []string{"-D", pg.data, "-p", strconv.Itoa(pg.port)}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	logf, err := os.OpenFile(pg.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own copy
	var from int64
	if fi, err := logf.Stat(); err == nil {
		from = fi.Size()
	}
	cmd := pg.command(filepath.Join(pg.bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	p := &process{name: "postgres", logFile: pg.log, cmd: cmd, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(p.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p.hasExited() {
			return errors.New("postgres exited at start-up")
		}
		b, _ := os.ReadFile(pg.log)
		if int64(len(b)) > from && strings.Contains(string(b[from:]), "ready to accept connections") && listening(pg.Addr()) {
			pg.proc = p
			return nil
		}
		if time.Now().After(deadline) {
			p.cmd.Process.Kill()
			<-p.exited
			return fmt.Errorf("postgres did not accept connections on %s within 30 s", pg.Addr())
		}
		time.Sleep(10 * time.Millisecond) // polling, bounded by the deadline
	}
}

// stop is "pg_ctl stop -m immediate" by PID: SIGQUIT ends every backend at
// once without a checkpoint; SIGKILL if it has not exited within a bounded
// wait.
func (pg *Postgres) stop(tb TB) {
	p := pg.proc
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.exited:
	case <-time.After(postgresStopWait):
		tb.Logf("postgres (pid %d) did not stop within %s of SIGQUIT: SIGKILL", p.cmd.Process.Pid, postgresStopWait)
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// Addr is the server's host:port.
func (pg *Postgres) Addr() string { return loopback(pg.port) }

// DSN is the URL of database on this server, as the pgx stdlib driver
// (and libpq) take it: user postgres over loopback TCP, no TLS.
func (pg *Postgres) DSN(database string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", pg.Addr(), database)
}

// NewDatabase creates a database of its own for a test (CREATE DATABASE,
// through createdb on the unix socket) and returns its DSN, so that tests
// on one server do not share tables.
func (pg *Postgres) NewDatabase(tb TB) string {
	tb.Helper()
	name := fmt.Sprintf("test_%d", pg.databases.Add(1))
	out, err := pg.command(filepath.Join(pg.bin, "createdb"), "-h", pg.dir, "-p", strconv.Itoa(pg.port), "-U", "postgres", name).CombinedOutput()
	if err != nil {
		tb.Fatalf("createdb %s: %v\n%s", name, err, out)
	}
	return pg.DSN(name)
}

// LogTail returns the last n lines of the server's log.
func (pg *Postgres) LogTail(n int) string { return tail(pg.log, n) }
