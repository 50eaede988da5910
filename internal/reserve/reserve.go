// Package reserve holds disk space back for the relay: a file of zeros
// beside the database that the relay deletes when the disk fills, so that
// it can still mark and delete sent rows (in SQLite even a DELETE needs
// space in the WAL) and so free the disk.
package reserve

import (
	"errors"
	"os"
	"sync"
)

// Reserve is a file of zeros beside the database that holds disk space back
// for the relay. When the disk fills, the application's writes fail first
// (ErrDiskFull); the relay then deletes the reserve, which gives it room to
// mark and delete sent rows — in SQLite even a DELETE needs space in the WAL
// — and so to free the disk. The reserve is written again once the disk has
// room.
type Reserve struct {
	Path string // the file: the database's path + "-reserve"
	Size int64

	mu   sync.Mutex
	held bool
}

// New is the reserve of the database at dbPath, size bytes; nil (a reserve
// that holds nothing and whose methods do nothing) without a file or a size.
func New(dbPath string, size int64) *Reserve {
	if dbPath == "" || size <= 0 {
		return nil
	}
	return &Reserve{Path: dbPath + "-reserve", Size: size}
}

// Fill writes the reserve file unless it is already there. It gives up,
// leaving no partial file, when the disk has no room for it.
func (r *Reserve) Fill() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held {
		return nil
	}
	if fi, err := os.Stat(r.Path); err == nil && fi.Size() >= r.Size {
		r.held = true
		return nil
	}
	f, err := os.OpenFile(r.Path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	// Written, not truncated to size: a sparse file would hold nothing back.
	zeros := make([]byte, 64<<10)
	for n := int64(0); n < r.Size && err == nil; n += int64(len(zeros)) {
		_, err = f.Write(zeros[:min(int64(len(zeros)), r.Size-n)])
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(r.Path)
		return err
	}
	r.held = true
	return nil
}

// Release deletes the reserve and reports whether there was one to delete.
func (r *Reserve) Release() bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held {
		return false
	}
	if err := os.Remove(r.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false
	}
	r.held = false
	return true
}

// Refill writes the reserve again when the disk has room for it and more.
func (r *Reserve) Refill() {
	if r == nil {
		return
	}
	r.mu.Lock()
	held := r.held
	r.mu.Unlock()
	if held {
		return
	}
	if free, ok := FreeBytes(r.Path); ok && free < 4*r.Size {
		return
	}
	r.Fill()
}

// ReleaseFile deletes the reserve of the database at dbPath before it is
// open, and reports how large it was and whether there was one.
func ReleaseFile(dbPath string) (int64, bool) {
	path := dbPath + "-reserve"
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return 0, false
	}
	return fi.Size(), os.Remove(path) == nil
}
