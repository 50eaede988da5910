// Package lease lets one relay, goroutine or process, drain a database at a
// time. Expiry is judged without comparing wall clocks, which jump on
// devices; a holder that is provably dead (same host, an earlier boot or a
// process that is gone) is not waited for.
package lease

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgeoutbox/outbox/internal/sqlconn"

	"github.com/edgeoutbox/outbox/internal/wait"
)

// Name is the lease table's row of the relay lease.
const Name = "relay"

// waitingName names the lease table's row in which a relay waiting for the
// lease announces itself (see lease.announce): its owner is the last relay
// that waited, its token counts the announcements.
const waitingName = Name + ".waiting"

// Lease makes sure that only one relay drains a database at a time, across
// goroutines and processes.
//
// Expiry is judged without comparing wall clocks, which jump on devices: the
// holder bumps a token on every renewal, and a contender takes over only
// after it has watched the token stand still for a whole TTL on its own
// monotonic clock. The holder stops dispatching when it has not renewed for
// half a TTL, so the two never overlap.
//
// A holder that is provably dead is not waited for: the lease records where
// its holder runs (see holder), and a relay restarted on the same host after
// a crash or a power cut — its predecessor's boot is over, or its process is
// gone — takes the lease at once instead of a whole TTL later.
type Lease struct {
	conn  *sqlconn.Conn
	owner string
	ttl   time.Duration
	now   func() time.Time // wall clock, only for the displayed expiry
	self  Holder           // where this relay runs

	// kick asks the keeper for a renewal now; told hears of each renewal.
	// Both hold one value.
	kick, told chan struct{}
	// lost is closed by Lose: a state write found the lease gone.
	lost     chan struct{}
	loseOnce sync.Once

	mu        sync.Mutex
	lastRenew time.Time // monotonic reading of the last successful renewal

	held []any // HeldArgs

	announced   time.Time // when this contender's last announcement committed (acquire's only)
	waitingSeen int64     // the announcements' token AnnouncedSince saw last
}

// New is the lease of the database conn is on, for a relay named owner,
// with a time to live of ttl; now is the wall clock, used only for the
// expiry shown to people.
func New(conn *sqlconn.Conn, owner string, ttl time.Duration, now func() time.Time) *Lease {
	l := &Lease{conn: conn, owner: owner, ttl: ttl, now: now, self: ThisHolder(),
		kick: make(chan struct{}, 1), told: make(chan struct{}, 1), lost: make(chan struct{})}
	l.held = []any{sql.Named("lease_owner", l.owner), sql.Named("lease_host", l.self.Host),
		sql.Named("lease_boot", l.self.BootID), sql.Named("lease_pid", l.self.PID),
		sql.Named("lease_pid_start", l.self.PIDStart)}
	return l
}

// TTL is the lease's time to live.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Conn is the connection the lease writes on.
func (l *Lease) Conn() *sqlconn.Conn { return l.conn }

// Kicked receives when a renewal was asked for (WaitValid): the keeper
// renews at once.
func (l *Lease) Kicked() <-chan struct{} { return l.kick }

// Valid reports whether the lease was renewed within half a TTL, and no
// state write found it gone (Lose): the holder publishes only then, so that
// it never overlaps a successor.
func (l *Lease) Valid() bool {
	select {
	case <-l.lost:
		return false
	default:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lastRenew.IsZero() && time.Since(l.lastRenew) < l.ttl/2
}

// LastRenewal is when the last renewal started.
func (l *Lease) LastRenewal() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastRenew
}

// Backdate makes the last renewal look as old as at: the relay's tests use
// it to make a lease lapse without waiting half a TTL.
func (l *Lease) Backdate(at time.Time) { l.renewed(at) }

func (l *Lease) renewed(at time.Time) {
	l.mu.Lock()
	l.lastRenew = at
	l.mu.Unlock()
	if !at.IsZero() {
		select {
		case l.told <- struct{}{}:
		default:
		}
	}
}

// WaitValid asks for a renewal and waits for one, or for at most d: the
// caller found the lease lapsed, after an idle spell or a renewal that has
// not come (a stalled database?). It returns false when ctx ends.
func (l *Lease) WaitValid(ctx context.Context, d time.Duration) bool {
	select {
	case <-l.told: // an earlier renewal's
	default:
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
	return wait.Sleep(ctx, d, l.told)
}

func (l *Lease) expiresMillis() int64 { return l.now().Add(l.ttl).UnixMilli() }

// Acquire blocks until the lease is held or ctx ends. waiting is called
// once with the holder's name when the lease is held by another relay; full
// with a write that failed for lack of space (SQLITE_FULL), and says
// whether it freed some.
func (l *Lease) Acquire(ctx context.Context, waiting func(holder string), full func(error) (freed bool)) error {
	var w watch
	told := false
	for {
		start := time.Now()
		took, holder, err := l.try(ctx, &w, start)
		switch {
		case err == nil:
		case sqlconn.IsBusy(err):
			// A database held busy past the busy timeout is no reason to
			// give up: try again.
		case sqlconn.IsFull(err) && full != nil:
			// Taking the lease is a write like any other: on a full disk it
			// may spend the reserve, and then try again at once; otherwise
			// it waits for space, as the relay would.
			if full(err) {
				continue
			}
		default:
			return err
		}
		if took {
			l.renewed(start)
			return nil
		}
		if holder != "" && !told && waiting != nil {
			waiting(holder)
			told = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(l.ttl / 8):
		}
	}
}

// watch is what a contender has seen of the holder's lease.
type watch struct {
	owner string
	token int64
	since time.Time // monotonic
	heard time.Time // the first announcement since then; zero: none yet
}

// A contender announces itself: an idle holder that watches its WAL
// renews only when it sees another connection's commit (the relay's keeper),
// so a contender must write before it may count the holder's silence. It
// writes every half TTL, and takes over only after the token stood still for
// a whole TTL and for three quarters of one since its first announcement in
// that time; the holder renews within its safety look (walwatch.SafetyPoll, at most
// half a TTL) of one, or at once when the event of the write comes.
const announceSQL = `INSERT INTO outbox_lease (name, owner, token, expires_at) VALUES (?, ?, 1, ?)
	ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = outbox_lease.token + 1, expires_at = excluded.expires_at`

// announce writes that this relay waits, at most every half TTL, and notes
// the first announcement since w began.
func (l *Lease) announce(ctx context.Context, w *watch) error {
	if l.announced.IsZero() || time.Since(l.announced) >= l.ttl/2 {
		if _, err := l.exec(ctx, announceSQL, waitingName, l.owner, l.expiresMillis()); err != nil {
			return err
		}
		l.announced = time.Now()
	}
	if w.heard.IsZero() && !l.announced.Before(w.since) {
		w.heard = l.announced
	}
	return nil
}

// AnnouncedSince reports whether a contender announced itself since the
// last call (the first call: whether one ever did); the keeper's only.
func (l *Lease) AnnouncedSince(ctx context.Context) bool {
	var token int64
	err := l.conn.Do(func(c *sql.Conn) error {
		st, err := l.conn.Stmt(ctx, c, `SELECT coalesce((SELECT token FROM outbox_lease WHERE name = ?), 0)`)
		if err != nil {
			return err
		}
		return st.QueryRowContext(ctx, waitingName).Scan(&token)
	})
	if err != nil {
		return true // renewing is the safe side
	}
	changed := token != l.waitingSeen
	l.waitingSeen = token
	return changed
}

// try takes the lease if it is free, released, ours, unrenewed for a whole
// TTL after this relay announced itself, or held by a relay that is
// provably dead; otherwise it returns the holder.
func (l *Lease) try(ctx context.Context, w *watch, now time.Time) (took bool, holder string, err error) {
	owner, token, where, found, err := l.read(ctx)
	if err != nil {
		return false, "", err
	}
	switch {
	case !found:
		took, err = l.exec(ctx, `INSERT INTO outbox_lease (name, owner, token, expires_at, host, machine_id, boot_id, pid, pid_start, pid_ns)
			VALUES (?, ?, 1, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING`,
			Name, l.owner, l.expiresMillis(), l.self.Host, l.self.MachineID, l.self.BootID, l.self.PID, l.self.PIDStart, l.self.PIDNS)
		return took, "", err
	case owner == "" || owner == l.owner:
	case where.DeadTo(l.self, ReadProc):
	case owner != w.owner || token != w.token:
		*w = watch{owner: owner, token: token, since: now}
		return false, owner, l.announce(ctx, w)
	case now.Sub(w.since) < l.ttl || w.heard.IsZero() || now.Sub(w.heard) < 3*l.ttl/4:
		return false, owner, l.announce(ctx, w)
	}
	// Free, ours, dead, or the holder has not renewed for a whole TTL: it
	// is gone.
	took, err = l.exec(ctx, `UPDATE outbox_lease SET owner = ?, token = token + 1, expires_at = ?, protocol = NULL, broker_says = NULL, broker_says_since = NULL, no_subscribers = NULL, no_subscribers_topic = NULL, no_subscribers_at = NULL,
			host = ?, machine_id = ?, boot_id = ?, pid = ?, pid_start = ?, pid_ns = ?
		WHERE name = ? AND owner = ? AND token = ?`,
		l.owner, l.expiresMillis(), l.self.Host, l.self.MachineID, l.self.BootID, l.self.PID, l.self.PIDStart, l.self.PIDNS,
		Name, owner, token)
	return took, owner, err
}

const renewSQL = `UPDATE outbox_lease SET token = token + 1, expires_at = ? WHERE name = ? AND owner = ?`

// Renew extends the lease; it returns ErrLost if another relay holds it.
// also, if not nil, writes in the renewal's transaction (one commit instead
// of two, which is most of what an idle relay costs); if it fails, the
// lease is renewed without it, and also's error is returned beside.
func (l *Lease) Renew(ctx context.Context, also func(context.Context, sqlconn.Prepared) error) (alsoErr, err error) {
	start := time.Now()
	var ok bool
	if also != nil {
		err = l.conn.Do(func(c *sql.Conn) error {
			// BEGIN and COMMIT as prepared statements of the connection,
			// not a *sql.Tx: each statement of a Tx is prepared again.
			run := func(q string, args ...any) (sql.Result, error) {
				st, err := l.conn.Stmt(ctx, c, q)
				if err != nil {
					return nil, err
				}
				return st.ExecContext(ctx, args...)
			}
			if err := l.conn.ExecPolling(ctx, c, `BEGIN IMMEDIATE`); err != nil {
				return err
			}
			committed := false
			defer func() {
				if !committed {
					c.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
				}
			}()
			res, err := run(renewSQL, l.expiresMillis(), Name, l.owner)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				return err // not ours: the plain renewal below says so
			}
			if alsoErr = also(ctx, sqlconn.Prepared{C: l.conn, SC: c}); alsoErr != nil {
				return nil
			}
			if _, err := run(`COMMIT`); err != nil {
				return err
			}
			committed, ok = true, true
			return nil
		})
		if err == nil && ok {
			l.renewed(start)
			return nil, nil
		}
		if alsoErr == nil {
			alsoErr = err
		}
	}
	ok, err = l.exec(ctx, renewSQL, l.expiresMillis(), Name, l.owner)
	if err != nil {
		return alsoErr, err
	}
	if !ok {
		return alsoErr, ErrLost
	}
	l.renewed(start)
	return alsoErr, nil
}

// Notes are what the holder tells another process's `outboxctl status`
// through the lease.
type Notes struct {
	// BrokerSays is what the broker says of itself while it says it
	// cannot take messages ("": nothing), since BrokerSince.
	BrokerSays  string
	BrokerSince time.Time
	// NoSubscribers counts the messages the broker took with no
	// subscriber since the holder started; the last topic and when.
	NoSubscribers      int64
	NoSubscribersTopic string
	NoSubscribersAt    time.Time
}

// SetNotes records n in the lease.
func (l *Lease) SetNotes(ctx context.Context, n Notes) error {
	var since, at any
	if n.BrokerSays != "" {
		since = n.BrokerSince.UnixMilli()
	}
	if n.NoSubscribers > 0 {
		at = n.NoSubscribersAt.UnixMilli()
	}
	_, err := l.exec(ctx, `UPDATE outbox_lease SET broker_says = nullif(?, ''), broker_says_since = ?,
		no_subscribers = nullif(?, 0), no_subscribers_topic = nullif(?, ''), no_subscribers_at = ? WHERE name = ? AND owner = ?`,
		n.BrokerSays, since, n.NoSubscribers, n.NoSubscribersTopic, at, Name, l.owner)
	return err
}

// SetProtocol records the protocol version the holder's connection
// speaks, for status.
func (l *Lease) SetProtocol(ctx context.Context, protocol string) error {
	_, err := l.exec(ctx, `UPDATE outbox_lease SET protocol = nullif(?, '') WHERE name = ? AND owner = ?`, protocol, Name, l.owner)
	return err
}

// HeldSQL is a condition that holds while the lease is this relay's, in
// this process: each of the relay's state writes (a mark, a charge, parking
// dead or expired) adds it to its WHERE, with HeldArgs, so that it changes
// nothing once another relay took over. The relay checks its lease before
// it publishes (Valid), but a relay stopped (SIGSTOP, a frozen VM) between
// that check and a write wakes to an acknowledgement or a refusal of a
// message its successor may have sent since. The process is checked as
// well as the owner: a relay started elsewhere with the same Owner takes
// the lease over at once (try), and the one it replaced must not pass the
// guard. It costs a lookup of one row by its primary key.
//
// Its parameters are named, and SQLite numbers a named parameter after the
// highest number used before it in the statement's text: it must come after
// every ?NNN of the statement, or it takes the number of one that follows.
const HeldSQL = `EXISTS (SELECT 1 FROM outbox_lease WHERE name = '` + Name + `' AND owner = :lease_owner
	AND host = :lease_host AND boot_id = :lease_boot AND pid = :lease_pid AND pid_start = :lease_pid_start)`

// HeldArgs are the arguments of HeldSQL for this lease, to append to a
// statement's own; the slice is shared and must not be changed.
func (l *Lease) HeldArgs() []any { return l.held[:len(l.held):len(l.held)] }

// Held reports whether the lease is still this relay's, as HeldSQL tells:
// whether a state write that changed nothing did so because the lease is
// gone. c is the connection to ask on (not prepared: this is the rare road).
func (l *Lease) Held(ctx context.Context, c *sql.Conn) (bool, error) {
	var held bool
	if err := c.QueryRowContext(ctx, `SELECT `+HeldSQL, l.HeldArgs()...).Scan(&held); err != nil {
		return false, fmt.Errorf("outbox: lease: %w", err)
	}
	return held, nil
}

// Lose says that a state write found the lease gone: Lost is closed, and
// the keeper stops the relay as it does when a renewal finds it gone.
func (l *Lease) Lose() { l.loseOnce.Do(func() { close(l.lost) }) }

// Lost is closed once Lose was called.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Release hands the lease back so that a successor need not wait a TTL.
func (l *Lease) Release(ctx context.Context) error {
	_, err := l.exec(ctx, `UPDATE outbox_lease SET owner = '', token = token + 1, expires_at = 0, protocol = NULL, broker_says = NULL, broker_says_since = NULL, no_subscribers = NULL, no_subscribers_topic = NULL, no_subscribers_at = NULL WHERE name = ? AND owner = ?`, Name, l.owner)
	l.renewed(time.Time{})
	return err
}

func (l *Lease) read(ctx context.Context) (owner string, token int64, where Holder, found bool, err error) {
	err = l.conn.Do(func(c *sql.Conn) error {
		return c.QueryRowContext(ctx, `SELECT owner, token, host, machine_id, boot_id, pid, pid_start, pid_ns
			FROM outbox_lease WHERE name = ?`, Name).Scan(&owner, &token,
			&where.Host, &where.MachineID, &where.BootID, &where.PID, &where.PIDStart, &where.PIDNS)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, Holder{}, false, nil
	}
	if err != nil {
		return "", 0, Holder{}, false, fmt.Errorf("outbox: lease: %w", err)
	}
	return owner, token, where, true, nil
}

func (l *Lease) exec(ctx context.Context, query string, args ...any) (bool, error) {
	var n int64
	err := l.conn.Do(func(c *sql.Conn) error {
		// Polling for the write lock, as a mark does: the relay's marks
		// wait for this connection meanwhile, and SQLite's busy handler,
		// whose sleeps grow to 100 ms, loses the lock for seconds to a
		// writer that commits every millisecond at FULL.
		var err error
		n, err = l.conn.ExecPollingCount(ctx, c, query, args...)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("outbox: lease: %w", err)
	}
	return n == 1, nil
}

// Holder is where a lease holder runs: the host, the boot and the process,
// as Linux names them. Elsewhere only the host is known, and a holder is
// never judged dead.
type Holder struct {
	Host      string
	MachineID string // /etc/machine-id: tells two hosts of one name apart
	BootID    string // /proc/sys/kernel/random/boot_id: new at every boot
	PID       int64
	PIDStart  int64  // the process's start time in clock ticks since boot: a reused pid has another
	PIDNS     string // the PID namespace: pids mean the same only within one
}

// ThisHolder describes the calling process.
func ThisHolder() Holder {
	h := Holder{PID: int64(os.Getpid())}
	h.Host, _ = os.Hostname()
	h.MachineID = readTrimmed("/etc/machine-id")
	if h.MachineID == "" {
		h.MachineID = readTrimmed("/var/lib/dbus/machine-id")
	}
	h.BootID = readTrimmed("/proc/sys/kernel/random/boot_id")
	h.PIDNS, _ = os.Readlink("/proc/self/ns/pid")
	// Only a start time that can be trusted is recorded; without one a
	// successor judges this process by its boot alone.
	if p, known := ReadProc(h.PID); known && p.Exists {
		h.PIDStart = p.Start
	}
	return h
}

// DeadTo reports whether a relay running as self can tell for certain that
// the holder h is dead: it ran on this host (same name and, where both know
// it, the same machine id) and either in an earlier boot, or in this boot, in
// this PID namespace, as another process that no longer exists (its pid is
// gone or belongs to a process started at another time). Anything it cannot
// tell for certain — another host, another namespace, a holder written by an
// older version, a process whose start time cannot be read reliably — counts
// as alive. proc reads a process's state.
func (h Holder) DeadTo(self Holder, proc func(pid int64) (ProcInfo, bool)) bool {
	switch {
	case h.Host == "" || h.Host != self.Host:
		return false
	case h.MachineID != "" && self.MachineID != "" && h.MachineID != self.MachineID:
		return false
	case h.BootID == "" || self.BootID == "":
		return false
	case h.BootID != self.BootID:
		return true
	case h.PID <= 0 || h.PIDStart <= 0 || h.PIDNS == "" || h.PIDNS != self.PIDNS:
		return false
	case h.PID == self.PID:
		return false // this very process: alive, whatever /proc says
	}
	p, known := proc(h.PID)
	switch {
	case !known:
		return false
	case !p.Exists:
		return true
	}
	return p.Start != h.PIDStart
}

// ProcInfo is what /proc says of a process.
type ProcInfo struct {
	Exists bool  // running, or stopped; not a zombie
	Start  int64 // start time in clock ticks since boot
}

// ReadProc reads /proc/PID/stat. known is false when the file cannot be
// trusted: qemu-user, for one, answers for its own process with made-up
// fields (a state of "0", a start time that moves).
func ReadProc(pid int64) (p ProcInfo, known bool) {
	b, err := os.ReadFile("/proc/" + strconv.FormatInt(pid, 10) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return ProcInfo{}, true
	}
	if err != nil {
		return ProcInfo{}, false
	}
	// The command name, field 2, is in parentheses and may hold anything,
	// parentheses and spaces included: count fields after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ProcInfo{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 || f[0][0] < 'A' || f[0][0] > 'z' {
		return ProcInfo{}, false
	}
	if f[0] == "Z" || f[0] == "X" || f[0] == "x" {
		return ProcInfo{}, true // killed, not yet reaped: gone
	}
	t, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil || t <= 0 {
		return ProcInfo{}, false
	}
	return ProcInfo{Exists: true, Start: t}, true
}

func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ErrLost: another relay took the lease over, which happens only when this
// one failed to renew it for a whole lease period.
var ErrLost = errors.New("outbox: relay lease lost to another relay")
