// Package durable keeps the relay's promise that a commit whose event went
// out survives a power cut: the WAL is fsynced after a batch is read and
// before it is published, except for rows known durable already (Commits),
// and the relay's own marks are synced often enough that a cut duplicates
// no more than a crash does (Gate).
package durable

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Commits knows which messages are durable without an fsync of the
// relay's: those that Transact committed at synchronous=FULL on a database
// that Open opened (so at FULL for certain). Such a COMMIT syncs the WAL
// before it updates the WAL index, so once the relay can see a row of it,
// that row is on the disk. The relay skips the fsync of a batch read whose
// rows are all of those: the common path of an application that commits
// through Transact no longer waits for a second fsync of what its COMMIT
// synced. Each transaction's rows are known by the range of seqs it
// inserted, noted by Enqueue before the COMMIT; while the transaction is
// open (the relay may see its rows before Transact returns) only together
// with its last row's id, since a seq alone could be another writer's after
// a rollback. Every other row is synced as before: an application's own
// transaction's, another process's (either may be at NORMAL), a renumbered
// one (its seq moved: schema/outbox.sql), and one that a writer set into a
// gap below a Transact row (committed later, at NORMAL perhaps, but read in
// the same batch: judging a batch by its last row alone let it out unsynced).
type Commits struct {
	// Full says the database is at FULL (Open with SyncFull): without it,
	// nothing is known durable.
	Full bool

	mu   sync.Mutex
	open map[*sql.Tx]durableRange // Transact's transactions, with what each enqueued
	done []durableRange           // committed, merged where adjacent; at most maxDurableRanges
}

// durableRange is the seqs one transaction inserted, first to last, and the
// id of its last row.
type durableRange struct {
	first, last int64
	id          string
}

// maxDurableRanges bounds what is kept while no relay reads (the oldest go
// first: their rows are then synced before publishing, as any other's).
const maxDurableRanges = 1024

// Begin notes a transaction of Transact's, so that Enqueue tells it its rows.
func (d *Commits) Begin(tx *sql.Tx) {
	if !d.Full {
		return
	}
	d.mu.Lock()
	if d.open == nil {
		d.open = make(map[*sql.Tx]durableRange)
	}
	d.open[tx] = durableRange{}
	d.mu.Unlock()
}

// Enqueued notes rows tx inserted, first to last (the last with its id), if
// tx is Transact's.
func (d *Commits) Enqueued(tx *sql.Tx, first, last int64, id string) {
	if !d.Full || first <= 0 || last < first {
		return
	}
	d.mu.Lock()
	if r, ok := d.open[tx]; ok {
		if r.first == 0 || first < r.first {
			r.first = first
		}
		if last > r.last {
			r.last, r.id = last, id
		}
		d.open[tx] = r
	}
	d.mu.Unlock()
}

// End forgets tx; committed says that its COMMIT returned without error.
func (d *Commits) End(tx *sql.Tx, committed bool) {
	if !d.Full || tx == nil {
		return
	}
	// The range joins done before the transaction leaves open, under the
	// lock covers takes: a batch read in between would otherwise find the
	// rows in neither, and fsync for nothing (TestTransactAtFullNeedsNoSyncBeforePublish
	// saw one under qemu-user).
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.open[tx]; committed && r.last > 0 {
		if n := len(d.done); n > 0 && d.done[n-1].last+1 == r.first {
			d.done[n-1].last, d.done[n-1].id = r.last, r.id
		} else {
			if n == maxDurableRanges {
				d.done = append(d.done[:0], d.done[1:]...)
			}
			d.done = append(d.done, r)
		}
	}
	delete(d.open, tx)
}

// Batch is a batch of rows the relay read, in seq order: Row(i) is the
// i-th row's seq and id.
type Batch interface {
	Len() int
	Row(i int) (seq int64, id string)
}

// Covers reports whether every row of a batch the caller has read is known
// durable, and forgets the ranges that end before it: the relay reads
// forward (after a new session it reads again what was not marked, and
// then syncs).
func (d *Commits) Covers(rows Batch) bool {
	n := rows.Len()
	if !d.Full || n == 0 {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	first, _ := rows.Row(0)
	k := 0
	for k < len(d.done) && d.done[k].last < first {
		k++
	}
	d.done = append(d.done[:0], d.done[k:]...)
	for i := range n {
		if seq, _ := rows.Row(i); !d.known(seq, rows) {
			return false
		}
	}
	return true
}

// known reports whether seq is a row of a committed range, or of an open
// transaction whose last row is in rows: visible, so committed, so synced.
func (d *Commits) known(seq int64, rows Batch) bool {
	for _, r := range d.done {
		if r.first <= seq && seq <= r.last {
			return true
		}
	}
	for _, r := range d.open {
		if r.first <= seq && seq <= r.last && hasRow(rows, r.last, r.id) {
			return true
		}
	}
	return false
}

// hasRow reports whether rows, in seq order, hold the row (seq, id).
func hasRow(rows Batch, seq int64, id string) bool {
	i := sort.Search(rows.Len(), func(i int) bool { s, _ := rows.Row(i); return s >= seq })
	if i == rows.Len() {
		return false
	}
	s, rid := rows.Row(i)
	return s == seq && rid == id
}

// Syncer makes the WAL durable before the relay publishes what it read
// from it. At synchronous=NORMAL (SyncNormal, or a sidecar writer's own
// setting) SQLite returns from COMMIT having written the WAL without an
// fsync, and the relay reads the commit from there at once; fsync on any
// descriptor of the file flushes what every writer wrote to it. At
// synchronous=FULL the writers' commits are durable already. Either way the
// sync makes the relay's own marks durable (written at NORMAL); Gate asks
// for more syncs when too many run ahead of them.
type Syncer struct {
	Path  string       // the WAL file
	Syncs atomic.Int64 // fsyncs tried, failed ones too: RelayStats.WALSyncs

	mu sync.Mutex
	f  *os.File
}

// Sync fsyncs the WAL. A WAL that does not exist holds nothing: what was
// committed is in the database file, which SQLite syncs when it checkpoints.
func (w *Syncer) Sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		f, err := os.OpenFile(w.Path, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		w.f = f
	}
	err := w.f.Sync()
	w.Syncs.Add(1)
	if err != nil {
		// Opened again next time: an error may leave the descriptor in a
		// state that later syncs would not report.
		w.f.Close()
		w.f = nil
	}
	return err
}

// Close releases the descriptor.
func (w *Syncer) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
}

// Gate keeps a power cut's duplicates within a crash's bound: the messages
// in flight plus those awaiting their mark (its bound). The relay writes its
// marks at synchronous=NORMAL, so a cut undoes the marks made since the
// WAL's last fsync, and the next relay sends those messages again. An
// fsync for a batch read covers the marks before it, but a batch is read
// ahead of the one being published, so on its own it lets up to two batches
// more run ahead of the durable mark. The gate counts the messages handed
// to the publisher that no completed sync covers; near the bound it asks a
// goroutine of its own to sync the WAL, and at the bound dispatch waits for
// that sync. The syncs run beside the publishing, not in its way: a sync
// that made dispatch wait for each one halved the drain rate.
//
// A sync covers only what had settled when it began, and the messages in
// flight or awaiting their mark never have: so the later a sync is asked
// for, the more each one covers. The gate asks as late as it can without
// making dispatch wait: when the room left under the bound is twice what
// was handed off during the last sync (the lead), and never later than
// past half the bound. Asking at half the bound, and again at once for an
// ask made during the sync, covered half as much per sync (BENCHMARKS.md).
type Gate struct {
	sync  func() error
	count *atomic.Int64 // the syncs SyncLoop made: RelayStats.MarkSyncs
	bound int64         // the most handed off and not covered
	// syncAt: past this many ahead, a sync is asked for: bound − lead, at
	// least bound / 2.
	syncAt atomic.Int64

	handedOff atomic.Int64 // messages handed to the publisher this session
	// settled counts the messages handed off that need no further sync:
	// recorded sent (counted once the mark has committed, so that a sync
	// begun after it covers it) or parked dead at once (sent again after
	// a cut, refused again: not a duplicate).
	settled atomic.Int64
	durable atomic.Int64 // settled, as of the start of the last sync

	kick   chan struct{} // asks syncLoop for a sync
	synced chan struct{} // told when durable moves

	// begun numbers the syncs as they begin, completed is the highest
	// number of one that succeeded, ended of one that ended, and next is
	// closed when the next one ends: a sync numbered above a Ticket began
	// after it was taken (Covered).
	begun, completed, ended atomic.Int64
	mu                      sync.Mutex
	next                    chan struct{}
}

// NewGate is a gate for one session: sync makes the WAL durable, count
// counts the syncs the gate asked for, bound is the most messages handed
// off that no completed sync may cover.
func NewGate(sync func() error, count *atomic.Int64, bound int64) *Gate {
	g := &Gate{
		sync: sync, count: count, bound: bound,
		kick: make(chan struct{}, 1), synced: make(chan struct{}, 1),
		next: make(chan struct{}),
	}
	g.syncAt.Store(bound / 2) // until a sync has been timed
	return g
}

// minSyncLead is the least lead: room for a sync that begins late.
const minSyncLead = 8

// SyncNow fsyncs the WAL and records what it covered: what had settled
// before it began. the batch reads' syncs come through here too.
func (g *Gate) SyncNow() error {
	covered := g.settled.Load()
	before := g.handedOff.Load()
	n := g.begun.Add(1)
	err := g.sync()
	if err == nil {
		raise(&g.completed, n)
	}
	raise(&g.ended, n)
	g.mu.Lock()
	close(g.next)
	g.next = make(chan struct{})
	g.mu.Unlock()
	if err != nil {
		return err
	}
	lead := 2*(g.handedOff.Load()-before) + minSyncLead
	g.syncAt.Store(max(g.bound-lead, g.bound/2))
	raise(&g.durable, covered)
	select {
	case g.synced <- struct{}{}:
	default:
	}
	return nil
}

// raise sets v to n if n is higher.
func raise(v *atomic.Int64, n int64) {
	for {
		c := v.Load()
		if n <= c || v.CompareAndSwap(c, n) {
			return
		}
	}
}

// Ticket is taken after a read: every row the read saw is durable once a
// sync numbered above it has succeeded, since that sync began after the
// rows were committed (Covered).
func (g *Gate) Ticket() int64 { return g.begun.Load() }

// Covered reports whether a sync that began after ticket was taken has
// succeeded.
func (g *Gate) Covered(ticket int64) bool { return g.completed.Load() > ticket }

// Running reports whether a sync that began after ticket was taken may
// still be under way.
func (g *Gate) Running(ticket int64) bool {
	b := g.begun.Load()
	return b > ticket && g.ended.Load() < b
}

// Ended is closed when the next sync ends, whether it succeeded or not.
func (g *Gate) Ended() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.next
}

// ahead is how many messages handed off no sync covers.
func (g *Gate) ahead() int64 { return g.handedOff.Load() - g.durable.Load() }

// Settle counts n messages that need no further sync, and asks for a sync
// if too many run ahead.
func (g *Gate) Settle(n int64) {
	g.settled.Add(n)
	g.askIfAhead()
}

// due reports whether a sync should begin: too many run ahead, and some of
// them have settled since the last sync began.
func (g *Gate) due() bool {
	return g.ahead() > g.syncAt.Load() && g.settled.Load() > g.durable.Load()
}

func (g *Gate) askIfAhead() {
	if g.due() {
		select {
		case g.kick <- struct{}{}:
		default:
		}
	}
}

// Admit waits until one more message may be handed off within the bound,
// and counts it. It returns false if ctx ends first.
func (g *Gate) Admit(ctx context.Context) bool {
	for g.ahead()+1 > g.bound {
		g.askIfAhead()
		select {
		case <-g.synced:
		case <-ctx.Done():
			return false
		}
	}
	g.handedOff.Add(1)
	g.askIfAhead()
	return true
}

// SyncLoop makes the marks durable when asked, until stop is closed. A
// sync that fails is tried again after a pause; meanwhile dispatch waits at
// the bound, as it would for marks that cannot be written.
func (g *Gate) SyncLoop(stop <-chan struct{}, failed func(error)) {
	for {
		select {
		case <-g.kick:
		case <-stop:
			return
		}
		if !g.due() {
			// Asked for during the last sync, which has since covered it
			// (a sync right after it would cover only what settled
			// meanwhile); or nothing new. The next settle asks again.
			continue
		}
		// Counted before it begins, so that a count of all syncs less
		// this one never takes a mark's sync for a batch read's.
		g.count.Add(1)
		if err := g.SyncNow(); err != nil {
			failed(err)
			select {
			case <-time.After(100 * time.Millisecond):
				g.askIfAhead()
			case <-stop:
				return
			}
		}
	}
}
