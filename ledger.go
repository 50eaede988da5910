package outbox

import "sync"

// The ledger: which acknowledged events may be marked sent. The mark is a
// high-water mark per priority (marks.go): recording seq N records every
// pending row of that priority up to N; a session keeps a ledger per
// priority. With batching, a batch of one topic may be acknowledged before an
// earlier event of another topic, so an acknowledgement alone does not say
// how far the mark may move. The ledger holds every row a session read, in
// seq order, and hands the ack loop the acknowledged rows once every row
// before them is settled — acknowledged, or parked dead (which needs no
// mark: the mark counts only live rows). A row that failed is never
// settled, so nothing after it is marked in that session, which is the
// session's barrier. Without batching, messages go in seq order and each
// acknowledgement is handed on at once.
type ledger struct {
	mu     sync.Mutex
	seqs   []int64 // from head on: rows read and not yet handed on
	states []settledAs
	head   int
	held   int // acknowledged, waiting behind an earlier row
}

type settledAs uint8

const (
	rowPending settledAs = iota
	rowAcked
	rowAckedLast // acknowledged, the last row of its message
	rowParked
)

// add records rows read, after every row added before.
func (l *ledger) add(rows []row) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.head > 0 && l.head >= len(l.seqs)/2 {
		// Compact: what is before head was handed on.
		n := copy(l.seqs, l.seqs[l.head:])
		copy(l.states, l.states[l.head:])
		l.seqs, l.states, l.head = l.seqs[:n], l.states[:n], 0
	}
	for i := range rows {
		l.seqs = append(l.seqs, rows[i].seq)
		l.states = append(l.states, rowPending)
	}
}

// settle records seqs (of one message, in order, of priority prio) as
// acknowledged, or parked, and appends to ready the acknowledged rows that
// may now be marked, in order.
func (l *ledger) settle(seqs []int64, st settledAs, prio uint8, ready []mark) []mark {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, s := range seqs {
		if i := l.find(s); i >= 0 && l.states[i] == rowPending {
			l.states[i] = st
			if st == rowAcked {
				l.held++
				if k == len(seqs)-1 {
					l.states[i] = rowAckedLast
				}
			}
		}
	}
	for l.head < len(l.seqs) && l.states[l.head] != rowPending {
		if st := l.states[l.head]; st != rowParked {
			ready = append(ready, mark{seq: l.seqs[l.head], ends: st == rowAckedLast, priority: prio})
			l.held--
		}
		l.head++
	}
	return ready
}

// find is the index of seq at or after head, or -1.
func (l *ledger) find(seq int64) int {
	lo, hi := l.head, len(l.seqs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if l.seqs[m] < seq {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(l.seqs) && l.seqs[lo] == seq {
		return lo
	}
	return -1
}

// waiting is how many acknowledged rows wait behind an earlier one: at the
// session's end they are sent again (a duplicate after a failure).
func (l *ledger) waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}
