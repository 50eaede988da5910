package outbox

import (
	"database/sql"
	"time"
)

// The relay's lanes, one per priority: a read takes rows of one priority,
// and each lane publishes its rows in seq order, so that commit order holds
// within a priority (and so within a topic of it). The highest priority
// with rows goes first, through the one window; a lower one gets one
// message in shareEvery while a higher one has more, so that a stream of
// high-priority events as fast as the link cannot hold the rest back for
// ever. A commit seen between hand-offs has the lanes asked again, so that
// a higher priority committed while a backlog drains goes out in the next
// free slot, not after the rows read before it.

const (
	// shareEvery: of every shareEvery messages while lower priorities wait,
	// one is theirs (in turn, from the highest down).
	shareEvery = 8
	// commitLook is how often, at most, dispatch asks whether another
	// connection committed (data_version) between hand-offs; a commit in
	// this process is seen at once.
	commitLook = 2 * time.Millisecond
)

// lane is one priority's rows read and not yet handed off.
type lane struct {
	cursor int64    // the last row read
	queue  []queued // read and packed, in the order they are published
	more   bool     // there may be rows after cursor
}

// queued is a parcel waiting for its turn, with how its read was packed.
type queued struct {
	p     *parcel
	rules parcelRules
}

// lanes is a session's lanes and what it last learnt of the outbox.
type lanes struct {
	l        [MaxPriority + 1]lane
	since    int // messages of the top lane since a lower one's turn
	turn     int // the lower lane that had the last turn
	aheadFor int // the lane whose next batch is being read ahead; -1: none
	floor    int // the lowest lane that publishes (scope)
	// From the last pick: a channel closed by the next commit in this
	// process, and the data_version read before it, and when it was read.
	wake    <-chan struct{}
	version int64
	lookAt  time.Time
}

func newLanes(floor int) lanes { return lanes{aheadFor: -1, turn: MaxPriority + 1, floor: floor} }

// busy reports whether lane p has rows to hand off, or may have.
func (ls *lanes) busy(p int) bool {
	return p >= ls.floor && (len(ls.l[p].queue) > 0 || ls.l[p].more || ls.aheadFor == p)
}

// top is the highest busy lane, or -1.
func (ls *lanes) top() int {
	for p := MaxPriority; p >= 0; p-- {
		if ls.busy(p) {
			return p
		}
	}
	return -1
}

// next chooses the lane whose parcel goes next, or -1 when none is busy.
func (ls *lanes) next() int {
	top := ls.top()
	lower := -1
	for p := top - 1; p >= 0; p-- {
		if ls.busy(p) {
			lower = p
			break
		}
	}
	if lower < 0 {
		ls.since = 0
		return top
	}
	if ls.since < shareEvery-1 {
		ls.since++
		return top
	}
	ls.since = 0
	// The lower lanes take their turns from the highest down, then again.
	for p := min(ls.turn, top) - 1; p >= 0; p-- {
		if ls.busy(p) {
			ls.turn = p
			return p
		}
	}
	ls.turn = lower
	return lower
}

// cursors are the lanes' cursors, for pick.
func (ls *lanes) cursors() (c [MaxPriority + 1]int64) {
	for p := range ls.l {
		c[p] = ls.l[p].cursor
	}
	return c
}

// repick asks the outbox which lanes have rows after their cursors. Unless
// it must (a session's start, after a wait), it does not wait for the
// reader, busy with a batch read ahead: done reports whether it asked.
func (s *session) repick(must bool) (done bool, err error) {
	ls := &s.lanes
	wake := s.r.ob.wake.wait()
	cur := ls.cursors()
	version, top, pending, done, err := s.r.pick(s.dctx, s.r.reader, &cur, must)
	if !done || err != nil {
		return done, err
	}
	ls.wake, ls.version, ls.lookAt = wake, version, time.Now()
	for p := range ls.l {
		ls.l[p].more = pending&(1<<p) != 0
	}
	if pending&1 == 0 {
		// Nothing of priority 0 after its cursor up to top: the rows of
		// other priorities there need not be passed again.
		ls.l[0].cursor = max(ls.l[0].cursor, top)
	}
	return true, nil
}

// committed reports whether a commit may have come since the last pick:
// at once for one in this process; for another's, within commitLook when
// the reader is free (a read ahead reads what came before it anyway, and
// waiting for it would let the window run dry).
func (s *session) committed() bool {
	ls := &s.lanes
	select {
	case <-ls.wake:
		return true
	default:
	}
	if time.Since(ls.lookAt) < commitLook {
		return false
	}
	var v int64
	asked, err := s.r.reader.TryDo(func(c *sql.Conn) (err error) {
		v, err = dataVersion(s.dctx, s.r.reader, c)
		return err
	})
	if !asked {
		return false
	}
	ls.lookAt = time.Now()
	return err != nil || v != ls.version
}
