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
// sync makes the relay's own marks durable (written at NORMAL), so that a
// power cut undoes at most the marks of two batches (see
// TestPublishedAheadOfDurableMarkBounded).
type walSyncer struct {
	path  string
	syncs atomic.Int64 // fsyncs tried, failed ones too: RelayStats.WALSyncs

	mu sync.Mutex
	f  *os.File
}

// sync fsyncs the WAL. A WAL that does not exist holds nothing: what was
// committed is in the database file, which SQLite syncs when it checkpoints.
func (w *walSyncer) sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		f, err := os.OpenFile(w.path, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		w.f = f
	}
	err := w.f.Sync()
	w.syncs.Add(1)
	if err != nil {
		// Opened again next time: an error may leave the descriptor in a
		// state that later syncs would not report.
		w.f.Close()
		w.f = nil
	}
	return err
}

// close releases the descriptor.
func (w *walSyncer) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
}
