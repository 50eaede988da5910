// Package walwatch notices commits to an SQLite database in WAL mode by any
// process, without polling while idle: the relay waits here for work. It
// watches the WAL file (inotify, one instance per process, on Linux), reads
// SQLite's own WAL index as a file so that a look need not be a query, and
// times the first looks after a write with a timer finer than Go's. Where
// the WAL cannot be watched, it polls.
//
// PRAGMA data_version stays the authority: the caller's Ask answers whether
// anything committed since its last read, and the watch only decides when
// to ask.
package walwatch

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/edgeoutbox/outbox/internal/wait"
)

// ErrNoWatch says that the WAL cannot be watched here (no inotify, none
// left, or no file): the caller polls instead.
var ErrNoWatch = errors.New("outbox: the WAL cannot be watched")

// FirstLook is how soon after a write to the WAL the watch looks again,
// the gaps growing by half each time up to the safety look. A commit is
// visible once SQLite has updated the WAL index (shared memory, which
// inotify does not see) after its last write, and at FULL after the fsync
// in between: so the watch looks at once, then again soon, and again. With
// gaps growing by half, it notices a commit at most half as late again as
// its fsync took, in about 23 looks per write up to the first second.
//
// SafetyPoll is the longest a watch goes without looking, the net for a
// write whose event never came; with the WAL index a look reads two files,
// and every askEvery-th asks data_version too, the net for an index that
// does not move. Both are long because each look wakes the process, which
// may host hundreds of relays. A watch whose caller renews nothing while
// idle (hearsAll) also asks once the looks after a write's event end,
// whatever the index says: it must hear a contender's announcement even if
// the index does not move, and its own writes, which the index spares it
// asking about, are few.
//
// Gaps shorter than napBelow are timed by a NapTimer too, since a Go timer
// under a millisecond takes a whole one in an idle process.
const (
	FirstLook  = 100 * time.Microsecond
	SafetyPoll = 5 * time.Second
	napBelow   = time.Millisecond
	askEvery   = 12               // safety looks per data_version query, with the WAL index
	deferOwn   = time.Millisecond // the longest a look waits for an own commit in flight
)

// Own counts the caller's own commits that a wait may discount (the relay's
// lease renewals, each of which commits when it succeeds). Started is
// counted before the statement and taken back when it fails; Done after it
// returned. Counting what did not commit could hide another process's
// commit until the next safety look; so nothing else is counted.
type Own struct {
	Started, Done atomic.Int64
}

// Options configures a Watch. The zero value is ready to use.
type Options struct {
	// PollInterval is how often a watch that cannot watch the WAL asks.
	// Default 2 ms.
	PollInterval time.Duration
	// SafetyPoll replaces SafetyPoll, the longest gap between looks (tests).
	SafetyPoll time.Duration
	// Subscribe and OpenIndex replace the package's own (tests).
	Subscribe func(path string) (*Subscription, error)
	OpenIndex func(dbPath string) (*Index, error)
	// Own, if set, counts the caller's own commits (see Own).
	Own *Own
	// Log receives why the watch polls, or stopped trusting the index.
	Log *slog.Logger
}

// Watch is one caller's watch on one database's commits. Wait is called by
// one goroutine at a time.
type Watch struct {
	opts   Options
	events <-chan struct{} // writes to the WAL by any process; nil: poll
	idx    *Index          // nil: every look asks
	napper *NapTimer       // nil: Go timers alone
	closes []func()        // what Close undoes
	own    *Own            // never nil
	safety time.Duration   // SafetyPoll or its replacement
}

// Open watches the database at dbPath ("": none, and the watch polls). It
// never fails: what cannot be watched is polled, and said in the log.
func Open(dbPath string, opts Options) *Watch {
	if opts.PollInterval <= 0 {
		opts.PollInterval = 2 * time.Millisecond
	}
	if opts.Subscribe == nil {
		opts.Subscribe = Subscribe
	}
	if opts.OpenIndex == nil {
		opts.OpenIndex = OpenIndex
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	w := &Watch{opts: opts, own: opts.Own, safety: opts.SafetyPoll}
	if w.own == nil {
		w.own = new(Own)
	}
	if w.safety <= 0 {
		w.safety = SafetyPoll
	}
	if dbPath == "" {
		return w
	}
	sub, err := opts.Subscribe(dbPath + "-wal")
	if err != nil {
		opts.Log.Info("outbox relay polls for other processes' commits", "every", opts.PollInterval, "why", err)
		return w
	}
	w.events = sub.C
	w.closes = append(w.closes, sub.Close)
	if idx, err := opts.OpenIndex(dbPath); err == nil {
		w.idx = idx
		w.closes = append(w.closes, idx.Close)
	}
	// Every wait starts with a short gap, so every watch naps: one timerfd
	// and one goroutine each.
	if n, err := NewNapTimer(); err == nil {
		w.napper = n
		w.closes = append(w.closes, n.Close)
	}
	return w
}

// Close ends the watch.
func (w *Watch) Close() {
	for i := len(w.closes) - 1; i >= 0; i-- {
		w.closes[i]()
	}
	w.closes = nil
}

// HearsAll reports whether a wait notices any other connection's commit
// within d: it watches the WAL and its index, and looks at least every d.
func (w *Watch) HearsAll(d time.Duration) bool {
	return w.events != nil && w.idx != nil && w.safety <= d
}

// Wait waits until a commit may have added rows: wake receives (an
// in-process notification), ask says something committed since the
// caller's last read, or ctx ends (false). hearsAll says whether the caller
// renews nothing while idle (see SafetyPoll).
func (w *Watch) Wait(ctx context.Context, wake <-chan struct{}, ask func(ctx context.Context) (changed, ok bool), hearsAll func() bool) bool {
	if w.events != nil {
		return w.waitForWAL(ctx, wake, ask, hearsAll)
	}
	t := time.NewTicker(w.opts.PollInterval)
	defer t.Stop()
	for {
		if woken, ok := wait.Tick(ctx, t.C, wake); !ok || woken {
			return ok
		}
		changed, ok := ask(ctx)
		if changed || !ok {
			return ok
		}
	}
}

// waitForWAL is Wait for a watch on the WAL.
func (w *Watch) waitForWAL(ctx context.Context, wake <-chan struct{}, ask func(ctx context.Context) (changed, ok bool), hearsAll func() bool) bool {
	// The fast looks start on entry too, not only at an event: the event
	// of a commit may have been taken (coalesced with the caller's own
	// write's) by the look that ended the last wait, before the commit was
	// visible to the read that followed; no other event comes for it.
	//
	// With the WAL index a look is two reads of files, not a query. It
	// counts the commits since the wait began, and data_version is asked
	// only when some were not the caller's own (Own); the fast looks stop
	// once no commit is under way. So an idle relay, whose own writes wake
	// it every few seconds, neither queries nor reads its outbox for them.
	// Every askEvery-th safety look asks anyway, and a commit the index did
	// not show turns the index off.
	//
	// The counts are read in an order that can only overstate others'
	// commits: the base of commits before the base of own ones started,
	// and at each look own ones done before commits; the ask at entry comes
	// after both bases, for what committed since the caller's read.
	idx := w.idx
	var base Header
	var ownBase int64
	if idx != nil {
		var ok bool
		if base, ok = idx.Look(); !ok {
			idx = nil
		}
		ownBase = w.own.Started.Load()
		if changed, ok := ask(ctx); changed || !ok {
			return ok
		}
	}
	gap := min(FirstLook, w.safety)
	t := time.NewTimer(gap)
	defer t.Stop()
	safeties := 0
	var deferredAt time.Time // since when a look waits for an own commit to return
	evented := false         // a write's event came since the last ask
	for {
		asking := idx == nil
		due := false // the gap has passed
		// A short gap is timed twice: the Go timer fires on time in a busy
		// process (the scheduler runs due timers between goroutines) and
		// the NapTimer in an idle one (the poller wakes for it), where the
		// Go timer takes a millisecond; the first wins.
		var napped <-chan struct{}
		if gap < napBelow && w.napper != nil {
			w.napper.Arm(gap)
			napped = w.napper.Fired()
		}
		select {
		case <-ctx.Done():
			return false
		case <-wake:
			return true
		case <-w.events:
			evented = true
			gap = FirstLook
		case <-t.C:
			due = true
		case <-napped:
			due = true
		}
		if due {
			if gap >= w.safety {
				safeties++
				asking = asking || safeties%askEvery == 0
			}
			gap = min(gap+gap/2, w.safety)
		}
		others := true
		if idx != nil {
			done := w.own.Done.Load()
			h, ok := idx.Look()
			others = !ok || int64(h.Commits-base.Commits) > done-ownBase
			if others && ok && w.own.Started.Load() > w.own.Done.Load() {
				// Most likely an own commit that has not returned yet:
				// look again soon rather than ask; but not for long, since
				// it may as well be waiting for the write lock behind the
				// very commit seen.
				now := time.Now()
				if deferredAt.IsZero() {
					deferredAt = now
				}
				if now.Sub(deferredAt) < deferOwn {
					gap = FirstLook
					t.Reset(gap)
					continue
				}
			}
			deferredAt = time.Time{}
			if !h.Pending {
				gap = w.safety // until the next event
				asking = asking || (evented && hearsAll())
			}
			asking = asking || others
		}
		if asking {
			evented = false
			changed, ok := ask(ctx)
			if changed && idx != nil {
				// What changed came after the base (the ask at entry saw
				// nothing), and is visible: the index must have moved. Not
				// necessarily its commit count: a WAL started again (new
				// salts) changes the header, and data_version, before the
				// commit that started it counts.
				if h, ok := idx.Look(); ok && h.Commits == base.Commits && h.Salts == base.Salts {
					w.opts.Log.Warn("outbox relay: SQLite's WAL index did not show a commit; looking with queries from now on")
					w.idx = nil
				}
			}
			if changed || !ok {
				return ok
			}
		}
		if gap >= w.safety {
			t.Reset(UntilAligned(w.safety))
		} else {
			t.Reset(gap)
		}
	}
}

// UntilAligned is how long until the next multiple of d on the wall clock,
// at most d. The safety looks of every watch in a process fall due
// together: the Go scheduler then wakes for one burst of them, instead of
// for each on its own (the wake-ups, not the looks, are most of what idle
// relays cost). A wall-clock jump only moves one look earlier.
func UntilAligned(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - time.Duration(time.Now().UnixNano()%int64(d))
}
