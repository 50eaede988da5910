package outbox

import (
	"bytes"
	"encoding/binary"
	"os"
)

// walIndex looks at SQLite's own record of the WAL without a query: the
// WAL-index header at the start of the -shm file (which every connection,
// in any process, maps into memory; a read of the file sees the same page)
// and the frame after the last committed one in the WAL. It tells a
// watching relay whether anything committed since its last look, and
// whether a commit is under way (its frames written, the header not yet
// updated: at FULL, the fsync in between). PRAGMA data_version stays the
// authority; this only spares the relay that query, and its wake-ups, while
// nothing is happening. See waitForWAL.
type walIndex struct {
	shm, wal *os.File
	last     [walIndexHdrSize]byte
	known    bool
}

// The WAL-index header (SQLite's WalIndexHdr, in the machine's byte order),
// kept twice at the start of the -shm file; a writer updates the second
// copy and then the first, so the two differ while it does.
const (
	walIndexHdrSize = 48
	walHdrSize      = 32 // the WAL file's own header
	walFrameHdrSize = 24
)

func openWALIndex(dbPath string) (*walIndex, error) {
	shm, err := os.Open(dbPath + "-shm")
	if err != nil {
		return nil, err
	}
	wal, err := os.Open(dbPath + "-wal")
	if err != nil {
		shm.Close()
		return nil, err
	}
	return &walIndex{shm: shm, wal: wal}, nil
}

func (w *walIndex) close() {
	w.shm.Close()
	w.wal.Close()
}

// look reads the header. changed: it differs from the last look's (or
// could not be read whole): something may have committed, ask SQLite.
// pending: the WAL holds a frame of the current generation after the last
// committed one, or that could not be told: a commit may be under way.
func (w *walIndex) look() (changed, pending bool) {
	var two [2 * walIndexHdrSize]byte
	if n, _ := w.shm.ReadAt(two[:], 0); n != len(two) || !bytes.Equal(two[:walIndexHdrSize], two[walIndexHdrSize:]) {
		w.known = false
		return true, true
	}
	hdr := two[:walIndexHdrSize]
	changed = !w.known || !bytes.Equal(hdr, w.last[:])
	copy(w.last[:], hdr)
	w.known = true
	if hdr[12] == 0 { // isInit: no connection has read the WAL yet
		return changed, true
	}
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
		return changed, false // nothing written after the last commit
	}
	return changed, bytes.Equal(frame[8:16], hdr[32:40])
}
