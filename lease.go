package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgeoutbox/outbox/internal/sqlconn"

	"github.com/edgeoutbox/outbox/internal/wait"
)

const leaseName = "relay"

// waitingName names the lease table's row in which a relay waiting for the
// lease announces itself (see lease.announce): its owner is the last relay
// that waited, its token counts the announcements.
const waitingName = leaseName + ".waiting"

// lease makes sure that only one relay drains a database at a time, across
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
type lease struct {
	conn  *sqlconn.Conn
	owner string
	ttl   time.Duration
	now   func() time.Time // wall clock, only for the displayed expiry
	self  holder           // where this relay runs

	// kick asks keepLease for a renewal now; told hears of each renewal.
	// Both hold one value; nil (a lease made by a test) never receives.
	kick, told chan struct{}

	mu        sync.Mutex
	lastRenew time.Time // monotonic reading of the last successful renewal

	announced   time.Time // when this contender's last announcement committed (acquire's only)
	waitingSeen int64     // the announcements' token keepLease saw last
}

func (l *lease) valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lastRenew.IsZero() && time.Since(l.lastRenew) < l.ttl/2
}

// lastRenewal is when the last renewal started.
func (l *lease) lastRenewal() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastRenew
}

func (l *lease) renewed(at time.Time) {
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

// waitValid asks for a renewal and waits for one, or for at most d: the
// caller found the lease lapsed, after an idle spell (see keepLease) or a
// renewal that has not come (a stalled database?). It returns false when
// ctx ends.
func (l *lease) waitValid(ctx context.Context, d time.Duration) bool {
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

func (l *lease) expiresMillis() int64 { return l.now().Add(l.ttl).UnixMilli() }

// acquire blocks until the lease is held or ctx ends. waiting is called once
// with the holder's name when the lease is held by another relay; full with
// a write that failed for lack of space, and says whether it freed some.
func (l *lease) acquire(ctx context.Context, waiting func(holder string), full func(error) (freed bool)) error {
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
		case errors.Is(classifyWriteErr(err), ErrDiskFull) && full != nil:
			// Taking the lease is a write like any other: on a full disk it
			// may spend the reserve, and then try again at once; otherwise
			// it waits for space, as the relay would.
			if full(classifyWriteErr(err)) {
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
// renews only when it sees another connection's commit (see keepLease),
// so a contender must write before it may count the holder's silence. It
// writes every half TTL, and takes over only after the token stood still for
// a whole TTL and for three quarters of one since its first announcement in
// that time; the holder renews within its safety look (walSafetyPoll, at most
// half a TTL) of one, or at once when the event of the write comes.
const announceSQL = `INSERT INTO outbox_lease (name, owner, token, expires_at) VALUES (?, ?, 1, ?)
	ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = outbox_lease.token + 1, expires_at = excluded.expires_at`

// announce writes that this relay waits, at most every half TTL, and notes
// the first announcement since w began.
func (l *lease) announce(ctx context.Context, w *watch) error {
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

// announcedSince reports whether a contender announced itself since the
// last call (the first call: whether one ever did); keepLease's only.
func (l *lease) announcedSince(ctx context.Context) bool {
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
func (l *lease) try(ctx context.Context, w *watch, now time.Time) (took bool, holder string, err error) {
	owner, token, where, found, err := l.read(ctx)
	if err != nil {
		return false, "", err
	}
	switch {
	case !found:
		took, err = l.exec(ctx, `INSERT INTO outbox_lease (name, owner, token, expires_at, host, machine_id, boot_id, pid, pid_start, pid_ns)
			VALUES (?, ?, 1, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING`,
			leaseName, l.owner, l.expiresMillis(), l.self.host, l.self.machineID, l.self.bootID, l.self.pid, l.self.pidStart, l.self.pidNS)
		return took, "", err
	case owner == "" || owner == l.owner:
	case where.deadTo(l.self, readProc):
	case owner != w.owner || token != w.token:
		*w = watch{owner: owner, token: token, since: now}
		return false, owner, l.announce(ctx, w)
	case now.Sub(w.since) < l.ttl || w.heard.IsZero() || now.Sub(w.heard) < 3*l.ttl/4:
		return false, owner, l.announce(ctx, w)
	}
	// Free, ours, dead, or the holder has not renewed for a whole TTL: it
	// is gone.
	took, err = l.exec(ctx, `UPDATE outbox_lease SET owner = ?, token = token + 1, expires_at = ?, protocol = NULL,
			host = ?, machine_id = ?, boot_id = ?, pid = ?, pid_start = ?, pid_ns = ?
		WHERE name = ? AND owner = ? AND token = ?`,
		l.owner, l.expiresMillis(), l.self.host, l.self.machineID, l.self.bootID, l.self.pid, l.self.pidStart, l.self.pidNS,
		leaseName, owner, token)
	return took, owner, err
}

const renewSQL = `UPDATE outbox_lease SET token = token + 1, expires_at = ? WHERE name = ? AND owner = ?`

// renew extends the lease; it returns ErrLeaseLost if another relay holds
// it. also, if not nil, writes in the renewal's transaction (one commit
// instead of two, which is most of what an idle relay costs); if it fails,
// the lease is renewed without it, and also's error is returned beside.
func (l *lease) renew(ctx context.Context, also func(context.Context, querier) error) (alsoErr, err error) {
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
			res, err := run(renewSQL, l.expiresMillis(), leaseName, l.owner)
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
	ok, err = l.exec(ctx, renewSQL, l.expiresMillis(), leaseName, l.owner)
	if err != nil {
		return alsoErr, err
	}
	if !ok {
		return alsoErr, ErrLeaseLost
	}
	l.renewed(start)
	return alsoErr, nil
}

// setProtocol records the MQTT version the holder's connection speaks.
func (l *lease) setProtocol(ctx context.Context, protocol string) error {
	_, err := l.exec(ctx, `UPDATE outbox_lease SET protocol = nullif(?, '') WHERE name = ? AND owner = ?`, protocol, leaseName, l.owner)
	return err
}

// release hands the lease back so that a successor need not wait a TTL.
func (l *lease) release(ctx context.Context) error {
	_, err := l.exec(ctx, `UPDATE outbox_lease SET owner = '', token = token + 1, expires_at = 0, protocol = NULL WHERE name = ? AND owner = ?`, leaseName, l.owner)
	l.renewed(time.Time{})
	return err
}

func (l *lease) read(ctx context.Context) (owner string, token int64, where holder, found bool, err error) {
	err = l.conn.Do(func(c *sql.Conn) error {
		return c.QueryRowContext(ctx, `SELECT owner, token, host, machine_id, boot_id, pid, pid_start, pid_ns
			FROM outbox_lease WHERE name = ?`, leaseName).Scan(&owner, &token,
			&where.host, &where.machineID, &where.bootID, &where.pid, &where.pidStart, &where.pidNS)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, holder{}, false, nil
	}
	if err != nil {
		return "", 0, holder{}, false, fmt.Errorf("outbox: lease: %w", err)
	}
	return owner, token, where, true, nil
}

func (l *lease) exec(ctx context.Context, query string, args ...any) (bool, error) {
	var n int64
	err := l.conn.Do(func(c *sql.Conn) error {
		// Polling for the write lock, as a mark does: the relay's marks
		// wait for this connection meanwhile, and SQLite's busy handler,
		// whose sleeps grow to 100 ms, lost the lock to a writer
		// committing every millisecond at FULL for up to 3 s (outboxctl
		// bench --full, section 3, sidecar: commit → PUBACK p99 620 ms).
		var err error
		n, err = l.conn.ExecPollingCount(ctx, c, query, args...)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("outbox: lease: %w", err)
	}
	return n == 1, nil
}

// holder is where a lease holder runs: the host, the boot and the process,
// as Linux names them. Elsewhere only the host is known, and a holder is
// never judged dead.
type holder struct {
	host      string
	machineID string // /etc/machine-id: tells two hosts of one name apart
	bootID    string // /proc/sys/kernel/random/boot_id: new at every boot
	pid       int64
	pidStart  int64  // the process's start time in clock ticks since boot: a reused pid has another
	pidNS     string // the PID namespace: pids mean the same only within one
}

// thisHolder describes the calling process.
func thisHolder() holder {
	h := holder{pid: int64(os.Getpid())}
	h.host, _ = os.Hostname()
	h.machineID = readTrimmed("/etc/machine-id")
	if h.machineID == "" {
		h.machineID = readTrimmed("/var/lib/dbus/machine-id")
	}
	h.bootID = readTrimmed("/proc/sys/kernel/random/boot_id")
	h.pidNS, _ = os.Readlink("/proc/self/ns/pid")
	// Only a start time that can be trusted is recorded; without one a
	// successor judges this process by its boot alone.
	if p, known := readProc(h.pid); known && p.exists {
		h.pidStart = p.start
	}
	return h
}

// deadTo reports whether a relay running as self can tell for certain that
// the holder h is dead: it ran on this host (same name and, where both know
// it, the same machine id) and either in an earlier boot, or in this boot, in
// this PID namespace, as another process that no longer exists (its pid is
// gone or belongs to a process started at another time). Anything it cannot
// tell for certain — another host, another namespace, a holder written by an
// older version, a process whose start time cannot be read reliably — counts
// as alive. proc reads a process's state.
func (h holder) deadTo(self holder, proc func(pid int64) (procInfo, bool)) bool {
	switch {
	case h.host == "" || h.host != self.host:
		return false
	case h.machineID != "" && self.machineID != "" && h.machineID != self.machineID:
		return false
	case h.bootID == "" || self.bootID == "":
		return false
	case h.bootID != self.bootID:
		return true
	case h.pid <= 0 || h.pidStart <= 0 || h.pidNS == "" || h.pidNS != self.pidNS:
		return false
	case h.pid == self.pid:
		return false // this very process: alive, whatever /proc says
	}
	p, known := proc(h.pid)
	switch {
	case !known:
		return false
	case !p.exists:
		return true
	}
	return p.start != h.pidStart
}

// procInfo is what /proc says of a process.
type procInfo struct {
	exists bool  // running, or stopped; not a zombie
	start  int64 // start time in clock ticks since boot
}

// readProc reads /proc/PID/stat. known is false when the file cannot be
// trusted: qemu-user, for one, answers for its own process with made-up
// fields (a state of "0", a start time that moves).
func readProc(pid int64) (p procInfo, known bool) {
	b, err := os.ReadFile("/proc/" + strconv.FormatInt(pid, 10) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return procInfo{}, true
	}
	if err != nil {
		return procInfo{}, false
	}
	// The command name, field 2, is in parentheses and may hold anything,
	// parentheses and spaces included: count fields after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 || f[0][0] < 'A' || f[0][0] > 'z' {
		return procInfo{}, false
	}
	if f[0] == "Z" || f[0] == "X" || f[0] == "x" {
		return procInfo{}, true // killed, not yet reaped: gone
	}
	t, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil || t <= 0 {
		return procInfo{}, false
	}
	return procInfo{exists: true, start: t}, true
}

func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// idleBefore reports whether the relay has been waiting for work since
// before t.
func (r *Relay) idleBefore(t time.Time) bool {
	since := r.idleSince.Load()
	return since > 0 && !t.IsZero() && r.epoch.Add(time.Duration(since)).Before(t)
}

// keepLease renews the lease every quarter TTL; losing it stops the relay.
// A renewal that fails is a write that failed: on a full disk it spends the
// reserve like any other, and it is tried again soon, because the relay
// stops publishing once it has not renewed for half a TTL.
//
// A relay connected and waiting for work since before its last renewal
// renews less: the renewals are most of what an idle relay costs
// (outboxctl fleet --idle: 500 idle relays in one process), and it
// publishes nothing that needs the lease valid. The first message after the
// lease lapsed asks for a renewal at once (lease.waitValid), a write before
// it is published.
//   - One that would hear any other connection's commit within half a TTL
//     (hearsAll: it watches the WAL and its index) does not renew at all.
//     A contender must announce itself with a write before it counts the
//     holder's silence (lease.announce); the wait ends at that commit, and
//     a wait that ends with nothing to read nudges a renewal.
//   - Any other renews every half TTL instead of every quarter. A contender
//     still never sees the token stand still for a whole TTL; its margin for
//     a late renewal is half a TTL instead of three quarters.
func (r *Relay) keepLease(ctx context.Context, l *lease, stop context.CancelCauseFunc) {
	t := time.NewTimer(l.ttl / 4)
	defer t.Stop()
	var lastWarn time.Time
	var lastMsg string
	quick := false  // the last attempt was an immediate retry
	parked := false // idle and hearing all: the timer is not set
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// A relay that has waited for work since before its last
			// renewal, which succeeded, skips (the test is against less
			// than half a TTL, for the timer's lateness: the second tick
			// after a renewal renews). Not one that waits between
			// messages: its lease would lapse as it renews, and a renewal
			// waiting for the write lock behind a busy writer would hold
			// its next message.
			last := l.lastRenewal()
			if r.idleBefore(last) && lastMsg == "" && r.hearsAll.Load() {
				// Parked: no timer until work, a contender or a kick.
				r.idleSkips.Add(1)
				parked = true
				continue
			}
			if r.idleBefore(last) && lastMsg == "" && time.Since(last) < l.ttl/2-l.ttl/8 {
				r.idleSkips.Add(1)
				t.Reset(l.ttl / 4)
				continue
			}
		case <-r.working:
			// Rows after an idle spell, or the session ended: renew as a
			// busy relay does.
			if !parked {
				continue
			}
			parked = false
			if d := l.ttl/4 - time.Since(l.lastRenewal()); d > 0 {
				t.Reset(d)
				continue
			}
		case <-r.nudge:
			// Another connection committed and there was nothing to read:
			// a contender announcing itself, perhaps. (Or the relay's own
			// commits: its reader may be a connection of its own.) A
			// parked relay that no longer hears all goes back to the timer.
			switch {
			case lastMsg != "":
				continue
			case !r.hearsAll.Load():
				if !parked {
					continue
				}
			case !l.announcedSince(ctx):
				continue
			}
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		case <-l.kick:
			if l.valid() {
				continue // renewed since it was asked
			}
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		}
		next := l.ttl / 4
		// Riding on the renewal: writers in other processes stamp
		// expiries with the stored outbox clock. Not on a full disk: its
		// page would take the space the marks need.
		var clock func(context.Context, querier) error
		if _, due := r.ob.clock.Due(); due && !r.diskFull.Load() {
			clock = r.ob.storeClock
		}
		r.own.Started.Add(1)
		clockErr, err := l.renew(ctx, clock)
		if clockErr != nil && ctx.Err() == nil {
			r.log.Debug("outbox relay could not store the outbox clock", "err", clockErr)
		}
		if err == nil {
			r.own.Done.Add(1) // renew changed the row: it committed
		} else {
			r.own.Started.Add(-1)
		}
		switch {
		case errors.Is(err, ErrLeaseLost):
			r.log.Error("outbox relay lost its lease; stopping")
			stop(ErrLeaseLost)
			return
		case err != nil && ctx.Err() == nil:
			err = classifyWriteErr(err)
			// Retried every TTL/16 on a disk that stays full: warn when it
			// starts, when the reason changes, and once a minute.
			level := slog.LevelDebug
			if msg := err.Error(); msg != lastMsg || time.Since(lastWarn) >= time.Minute {
				level, lastMsg, lastWarn = slog.LevelWarn, msg, time.Now()
			}
			r.log.Log(ctx, level, "outbox relay could not renew its lease", "err", err)
			next = l.ttl / 16
			freed := r.writeFailed(err)
			// Each renewal appends a page to the WAL, and only a complete
			// checkpoint lets SQLite write the WAL from its start again:
			// an idle relay would spend the reserve in minutes, then lose
			// its lease on a disk that stays full. So, while no marks need
			// the space, copy the WAL into the database now, with the
			// reserve's space; from then on renewals take none.
			ckpt := errors.Is(err, ErrDiskFull) && !r.connected.Load() && (freed || !quick) && walCheckpointed(ctx, l.conn)
			if ckpt {
				r.log.Info("outbox: disk full; copied the WAL into the database, so that lease renewals need no new space")
			}
			if freed || ckpt {
				next = 0
			}
		default:
			lastMsg = ""
			r.metrics.writeFailed.Store(false)
		}
		quick, parked = next == 0, false
		t.Reset(next)
	}
}
