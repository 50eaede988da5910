//go:build linux && !arm

package fusefs

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"syscall"
)

// PageSize is the unit of a torn cut: each unsynced page is kept or dropped
// as a whole, as a disk writes sectors.
const PageSize = 4096

// pageBits has a bit per byte of a page: the bytes changed since the sync.
type pageBits [PageSize / 64]uint64

// fileState is what a file has been through since its last fsync or
// fdatasync: enough to put it back as it was then. It exists only for a
// file changed since its last sync (or since the mount, which starts with
// everything durable).
type fileState struct {
	// synced is the file's size at its last sync.
	synced int64
	// pre holds, for each page changed since the sync that lay (partly)
	// within the synced size, that page's synced bytes (up to synced):
	// saved before the first change, so that a cut can write it back.
	pre map[int64][]byte
	// changed marks the bytes written, or cut off by a truncate, since
	// the sync: what a cut drops, counted.
	changed map[int64]*pageBits
	// dirty holds the pages written since the sync (not those only cut
	// off by a truncate): what a file system writes back at the next one
	// (Counts.Pages).
	dirty map[int64]struct{}
}

func newFileState(size int64) *fileState {
	return &fileState{synced: size, pre: map[int64][]byte{}, changed: map[int64]*pageBits{}, dirty: map[int64]struct{}{}}
}

// readAtFunc reads len(buf) bytes at off from the backing file.
type readAtFunc func(buf []byte, off int64) error

// preserve saves the synced content of the pages that [off, end) touches,
// those not saved yet, before the caller changes them. Only a page's
// synced part is saved: what lies beyond the synced size a cut removes by
// truncating.
func (s *fileState) preserve(read readAtFunc, off, end int64) error {
	end = min(end, s.synced)
	for pg := off / PageSize; pg*PageSize < end; pg++ {
		if _, ok := s.pre[pg]; ok {
			continue
		}
		start := pg * PageSize
		buf := make([]byte, min(PageSize, s.synced-start))
		if err := read(buf, start); err != nil {
			return fmt.Errorf("save page %d: %w", pg, err)
		}
		s.pre[pg] = buf
	}
	return nil
}

// mark records that [off, end) changed.
func (s *fileState) mark(off, end int64) {
	for off < end {
		pg := off / PageSize
		b := s.changed[pg]
		if b == nil {
			b = &pageBits{}
			s.changed[pg] = b
		}
		last := min(end, (pg+1)*PageSize)
		for i := off - pg*PageSize; i < last-pg*PageSize; i++ {
			b[i/64] |= 1 << (i % 64)
		}
		off = last
	}
}

// wrote records that [off, end) was written, for Counts.Pages.
func (s *fileState) wrote(off, end int64) {
	for pg := off / PageSize; pg*PageSize < end; pg++ {
		s.dirty[pg] = struct{}{}
	}
}

// changedIn counts the changed bytes of page pg at offsets >= from.
func (s *fileState) changedIn(pg, from int64) int64 {
	b := s.changed[pg]
	if b == nil {
		return 0
	}
	var n int
	for i, w := range b {
		lo := pg*PageSize + int64(i)*64
		switch {
		case lo >= from:
			n += bits.OnesCount64(w)
		case lo+64 > from:
			n += bits.OnesCount64(w >> (from - lo))
		}
	}
	return int64(n)
}

// changedBytes counts every changed byte: what a cut of a file that does
// not survive drops.
func (s *fileState) changedBytes() int64 {
	var n int64
	for pg := range s.changed {
		n += s.changedIn(pg, 0)
	}
	return n
}

// pages lists the pages changed since the sync, in order.
func (s *fileState) pages() []int64 {
	var pgs []int64
	for pg := range s.pre {
		pgs = append(pgs, pg)
	}
	for pg := range s.changed {
		if _, ok := s.pre[pg]; !ok {
			pgs = append(pgs, pg)
		}
	}
	slices.Sort(pgs)
	return pgs
}

// revert puts the file open as fd back as it was at its last sync and
// returns how many changed bytes that dropped. With rng, the cut is torn:
// each changed page is kept (its new content) or dropped (its synced
// content; zeros where it lay beyond the synced size) by a coin flip, and
// so is the size, if it changed.
func (s *fileState) revert(fd int, rng *rand.Rand) (dropped int64, err error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return 0, err
	}
	size := s.synced
	if rng != nil && st.Size != s.synced && rng.IntN(2) == 0 {
		size = st.Size
	}
	zeros := make([]byte, PageSize)
	for _, pg := range s.pages() {
		start := pg * PageSize
		if start >= size {
			dropped += s.changedIn(pg, 0) // cut off by the size
			continue
		}
		if rng != nil && rng.IntN(2) == 0 {
			dropped += s.changedIn(pg, size) // kept, but the size may cut its end
			continue
		}
		dropped += s.changedIn(pg, 0)
		img := s.pre[pg]
		if len(img) > 0 {
			if err := pwriteAll(fd, img, start); err != nil {
				return dropped, err
			}
		}
		// What the page held past the synced size was never synced:
		// after a cut that keeps the larger size, it reads as zeros.
		if rest := min(start+PageSize, size) - (start + int64(len(img))); rest > 0 {
			if err := pwriteAll(fd, zeros[:rest], start+int64(len(img))); err != nil {
				return dropped, err
			}
		}
	}
	return dropped, syscall.Ftruncate(fd, size)
}

func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := syscall.Pwrite(fd, b, off)
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func preadAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := syscall.Pread(fd, b, off)
		if err != nil {
			return err
		}
		if n == 0 {
			// Shorter than its synced size: only if something
			// changed the backing file behind the mount. Zeros.
			clear(b)
			return nil
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}
