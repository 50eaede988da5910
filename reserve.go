package outbox

import (
	"errors"
	"os"
	"sync"
	"syscall"

	"github.com/edgeoutbox/outbox/internal/sqlconn"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// DefaultReserveBytes is the disk space an Outbox keeps back unless
// Options.ReserveBytes says otherwise.
const DefaultReserveBytes = 1 << 20

// reserve is a file of zeros beside the database that holds disk space back
// for the relay. When the disk fills, the application's writes fail first
// (ErrDiskFull); the relay then deletes the reserve, which gives it room to
// mark and delete sent rows — in SQLite even a DELETE needs space in the WAL
// — and so to free the disk. The reserve is written again once the disk has
// room.
type reserve struct {
	path string
	size int64

	mu   sync.Mutex
	held bool
}

func newReserve(dbPath string, size int64) *reserve {
	if dbPath == "" || size <= 0 {
		return nil
	}
	return &reserve{path: dbPath + "-reserve", size: size}
}

// fill writes the reserve file unless it is already there. It gives up,
// leaving no partial file, when the disk has no room for it.
func (r *reserve) fill() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held {
		return nil
	}
	if fi, err := os.Stat(r.path); err == nil && fi.Size() >= r.size {
		r.held = true
		return nil
	}
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	// Written, not truncated to size: a sparse file would hold nothing back.
	zeros := make([]byte, 64<<10)
	for n := int64(0); n < r.size && err == nil; n += int64(len(zeros)) {
		_, err = f.Write(zeros[:min(int64(len(zeros)), r.size-n)])
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(r.path)
		return err
	}
	r.held = true
	return nil
}

// release deletes the reserve and reports whether there was one to delete.
func (r *reserve) release() bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held {
		return false
	}
	if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false
	}
	r.held = false
	return true
}

// refill writes the reserve again when the disk has room for it and more.
func (r *reserve) refill() {
	if r == nil {
		return
	}
	r.mu.Lock()
	held := r.held
	r.mu.Unlock()
	if held {
		return
	}
	if free, ok := freeBytes(r.path); ok && free < 4*r.size {
		return
	}
	r.fill()
}

// releaseReserveFile deletes the reserve of the database at dbPath before it
// is open, and reports how large it was and whether there was one.
func releaseReserveFile(dbPath string) (int64, bool) {
	path := dbPath + "-reserve"
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return 0, false
	}
	return fi.Size(), os.Remove(path) == nil
}

// noSpace reports whether err says the disk has no room: SQLITE_FULL,
// SQLITE_IOERR_SHMSIZE (SQLite could not grow the -shm file, which it writes
// a page at a time so that the mapping never hits a hole) or ENOSPC.
func noSpace(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code() == sqlite3.SQLITE_IOERR_SHMSIZE {
		return true
	}
	return sqlconn.Code(err) == sqlite3.SQLITE_FULL || errors.Is(err, syscall.ENOSPC)
}
