package outbox

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
)

// walSyncer makes the WAL durable before the relay publishes what it read
// from it. At synchronous=NORMAL (SyncNormal, or a sidecar writer's own
// setting) SQLite returns from COMMIT having written the WAL without an
// fsync, and the relay reads the commit from there at once; fsync on any
// descriptor of the file flushes what every writer wrote to it. At
// synchronous=FULL the writers' commits are durable already. Either way the
// sync makes the relay's own marks durable (written at NORMAL); the mark
// loop syncs too when too many marks wait for one (session.markLoop), so
// that a power cut can make the relay send again no more than a crash can.
type walSyncer struct {
	path  string
	syncs atomic.Int64 // fsyncs tried, failed ones too: RelayStats.WALSyncs
	marks atomic.Int64 // of them, those made for the marks: RelayStats.MarkSyncs
	// begun numbers the syncs as they start; durable is the number of the
	// last one that succeeded. A commit made before sync number n began is
	// durable once durable >= n: see ticket.
	begun, durable atomic.Int64

	mu sync.Mutex
	f  *os.File
}

// sync fsyncs the WAL. A WAL that does not exist holds nothing: what was
// committed is in the database file, which SQLite syncs when it checkpoints.
func (w *walSyncer) sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.begun.Add(1)
	if w.f == nil {
		f, err := os.OpenFile(w.path, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			w.durable.Store(n)
			return nil
		}
		if err != nil {
			return err
		}
		w.f = f
	}
	err := w.f.Sync()
	w.syncs.Add(1)
	if err == nil {
		w.durable.Store(n)
	}
	if err != nil {
		// Opened again next time: an error may leave the descriptor in a
		// state that later syncs would not report.
		w.f.Close()
		w.f = nil
	}
	return err
}

// ticket is taken right after a commit: the commit is durable once
// covered(ticket) (a sync that began after the ticket has succeeded).
func (w *walSyncer) ticket() int64 { return w.begun.Load() + 1 }

// covered reports whether the commit that took ticket t is durable.
func (w *walSyncer) covered(t int64) bool { return w.durable.Load() >= t }

// close releases the descriptor.
func (w *walSyncer) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
}
