package walwatch

import (
	"bytes"
	"encoding/binary"
	"os"
)

// Index looks at SQLite's own record of the WAL without a query: the
// WAL-index header at the start of the -shm file (which every connection,
// in any process, maps into memory; a read of the file sees the same page)
// and the frame after the last committed one in the WAL. It tells a
// watching relay how many commits there were (so that it can tell its own
// from others'), and whether a commit is under way (its frames written, the header not yet
// updated: at FULL, the fsync in between). PRAGMA data_version stays the
// authority; this only spares the relay that query, and its wake-ups, while
// nothing is happening. See Watch.Wait.
type Index struct {
	shm, wal *os.File
}

// The WAL-index header (SQLite's WalIndexHdr, in the machine's byte order),
// kept twice at the start of the -shm file; a writer updates the second
// copy and then the first, so the two differ while it does.
const (
	walIndexHdrSize = 48
	walHdrSize      = 32 // the WAL file's own header
	walFrameHdrSize = 24
)

// OpenIndex opens the -shm and -wal files of the database at dbPath.
func OpenIndex(dbPath string) (*Index, error) {
	shm, err := os.Open(dbPath + "-shm")
	if err != nil {
		return nil, err
	}
	wal, err := os.Open(dbPath + "-wal")
	if err != nil {
		shm.Close()
		return nil, err
	}
	return &Index{shm: shm, wal: wal}, nil
}

// Close closes the files.
func (w *Index) Close() {
	w.shm.Close()
	w.wal.Close()
}

// Header is what a look at the WAL-index header found.
type Header struct {
	// Commits counts the commits to this database so far, by any
	// connection (SQLite's iChange, which every commit, and nothing else,
	// moves on by one; it wraps).
	Commits uint32
	// Salts are the WAL's current salts. A writer that finds the WAL
	// checkpointed starts it again from its beginning with new salts, and
	// writes them to the header before its frames, and so before its
	// commit moves Commits; a RESTART or TRUNCATE checkpoint does the
	// same. SQLite's readers see any change of the header as a change of
	// the database (PRAGMA data_version moves), so a caller that compares
	// the index with data_version must compare the salts too.
	Salts [8]byte
	// Pending says that the WAL holds a frame of the current generation
	// after the last committed one, or that this could not be told: a
	// commit may be under way.
	Pending bool
}

// Look reads the header. ok is false when the header could not be read
// whole, or a writer was updating it: ask SQLite.
func (w *Index) Look() (h Header, ok bool) {
	var two [2 * walIndexHdrSize]byte
	if n, _ := w.shm.ReadAt(two[:], 0); n != len(two) || !bytes.Equal(two[:walIndexHdrSize], two[walIndexHdrSize:]) {
		return Header{Pending: true}, false
	}
	hdr := two[:walIndexHdrSize]
	if hdr[12] == 0 { // isInit: no connection has read the WAL yet
		return Header{Pending: true}, false
	}
	h.Commits = binary.NativeEndian.Uint32(hdr[8:])
	copy(h.Salts[:], hdr[32:40])
	size := int64(binary.NativeEndian.Uint16(hdr[14:]))
	if size == 1 {
		size = 65536
	}
	mxFrame := int64(binary.NativeEndian.Uint32(hdr[16:]))
	// The next frame belongs to a commit under way if it carries the
	// current salts (SQLite's own test when it recovers a WAL); a frame
	// left from before the WAL was restarted carries older ones.
	var frame [walFrameHdrSize]byte
	n, _ := w.wal.ReadAt(frame[:], walHdrSize+mxFrame*(size+walFrameHdrSize))
	if n != len(frame) {
		return h, true // nothing written after the last commit
	}
	h.Pending = bytes.Equal(frame[8:16], h.Salts[:])
	return h, true
}
