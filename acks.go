package outbox

import (
	"errors"
	"time"

	"github.com/edgeoutbox/outbox/internal/wait"
)

// The ack loop: acknowledgements awaited in publish order, and what a
// missing or refused one says (the isolation rule: session.go).

var (
	errNoAck          = errors.New("no acknowledgement within the ack timeout")
	errConnectionLost = errors.New("connection lost")
)

// flight is a publish awaiting its acknowledgement: one row, or a batch.
// A row parked dead at its turn passes through the ack loop too (parked),
// so that the ledger learns of it in order.
type flight struct {
	seq   int64 // the first row's
	prio  uint8 // its rows' priority
	id    string
	topic string
	tok   Token
	sent  time.Time
	probe bool
	// created is the first row's created_at (Unix ms), for the
	// commit-to-PUBACK histogram.
	created int64
	// attempts is the first row's failed attempts before this one.
	attempts int
	// rows is a batch's rows, nil for one row.
	rows   []*row
	parked bool
	bytes  int // the payload's, held in WindowBytes
}

func newFlight(p *parcel, tok Token, probe bool) flight {
	m := p.first()
	f := flight{seq: m.seq, prio: m.priority, id: m.id, topic: p.topic, tok: tok, sent: time.Now(), probe: probe, created: m.createdAt, attempts: m.attempts, bytes: len(p.payload)}
	if len(p.rows) > 1 {
		f.rows = p.rows
	}
	return f
}

// n is how many rows f carries.
func (f *flight) n() int { return max(len(f.rows), 1) }

// last is the seq of f's last row.
func (f *flight) last() int64 {
	if f.rows != nil {
		return f.rows[len(f.rows)-1].seq
	}
	return f.seq
}

// seqs appends f's rows' seqs to dst.
func (f *flight) seqs(dst []int64) []int64 {
	if f.rows == nil {
		return append(dst, f.seq)
	}
	for _, m := range f.rows {
		dst = append(dst, m.seq)
	}
	return dst
}

// ackLoop waits for the acknowledgements in publish order.
func (s *session) ackLoop() {
	r := s.r
	defer close(s.marks)
	var giveUp <-chan time.Time // armed once the session ends
	done := s.sctx.Done()
	arm := func() {
		if giveUp == nil {
			giveUp = time.After(r.opts.ShutdownTimeout)
		}
		done = nil
	}
	abandoned := false
	// One timer for every flight: since Go 1.23 a Reset timer never
	// delivers a stale expiry.
	timer := time.NewTimer(r.opts.AckTimeout)
	defer timer.Stop()
	// Until its packet is seen gone, a flight is looked at this often:
	// its ack clock starts when it is first seen gone, so this is how much
	// longer than AckTimeout a missing PUBACK may take to be noticed. A
	// PUBACK that comes sooner costs no look.
	look := max(r.opts.AckTimeout/16, time.Millisecond)
	var seqs []int64
	var ready []mark
	// emit hands the rows the ledger says may be marked to the mark loop.
	emit := func(f *flight, st settledAs) {
		ready = s.ledgers[f.prio].settle(f.seqs(seqs[:0]), st, f.prio, ready[:0])
		for _, m := range ready {
			// Waits while markSlots acknowledged rows are not yet
			// recorded: marks that lag hold back publishing.
			s.unmarked <- struct{}{}
			s.marks <- m
		}
	}
	for f := range s.flights {
		if f.parked {
			if !abandoned {
				emit(&f, rowParked)
			}
			continue
		}
		if abandoned {
			r.inFlight.Add(-int64(f.n()))
			continue
		}
		var err error
		wt, _ := f.tok.(ProgressToken)
		if wt != nil {
			timer.Reset(min(time.Until(f.sent.Add(r.opts.AckTimeout)), look))
		} else {
			timer.Reset(time.Until(f.sent.Add(r.opts.AckTimeout)))
		}
	await:
		for {
			select {
			case <-f.tok.Done():
				err = f.tok.Error()
				break await
			case <-timer.C:
				stalled := false
				if wt != nil {
					left, since := wt.Progress()
					if d := time.Until(wait.Later(f.sent, since).Add(r.opts.AckTimeout)); d > 0 {
						if !left {
							d = min(d, look)
						}
						timer.Reset(d)
						continue
					}
					stalled = !left
				}
				cause := errNoAck
				if stalled {
					cause = ErrStalled
				}
				flt := faultConnection
				if stalled {
					flt = faultStalled
				}
				s.setFail(failure{seq: f.seq, last: f.last(), prio: f.prio, err: cause, probe: f.probe, fault: flt})
				// Disconnecting completes this token with an error.
				r.pub.Disconnect()
			case <-done:
				arm()
			case <-giveUp:
				// Shutdown or a publisher that does not complete its
				// tokens: leave the rest pending; they are sent again
				// next time.
				abandoned = true
				err = errors.New("abandoned at shutdown")
				break await
			}
		}
		timer.Stop()
		if err == nil && !s.markable(f.seq) {
			// Acknowledged after a message before it failed: it is sent
			// again with that one (a duplicate after a failure).
			r.inFlight.Add(-int64(f.n()))
			s.release(&f)
			continue
		}
		if err == nil {
			if f.rows == nil {
				r.acked(f.sent, f.created)
			} else {
				for _, m := range f.rows {
					r.acked(f.sent, m.createdAt)
				}
			}
			if nt, ok := f.tok.(NoSubscribersToken); ok && nt.NoSubscribers() {
				r.heardByNobody(f.topic)
			}
			emit(&f, rowAcked)
			s.settled(f)
			continue
		}
		flt := faultOf(err)
		if !abandoned && flt == faultUndeliverable && f.rows == nil && s.markable(f.seq) {
			// Refused for good, on a connection that stays up: parked at
			// once, and nothing behind it need wait or go again.
			parked, perr := r.refusedForGood(s.conn, f.seq, f.id, f.topic, f.attempts, err)
			if parked {
				r.inFlight.Add(-1)
				s.gate.Settle(1)
				emit(&f, rowParked)
				s.settled(f)
				continue
			}
			// Not recorded, or the policy wants it retried: it goes
			// through the charge below instead.
			if perr != nil {
				r.writeFailed(perr)
			}
		}
		r.inFlight.Add(-int64(f.n()))
		s.release(&f)
		if !abandoned {
			s.setFail(failure{seq: f.seq, last: f.last(), prio: f.prio, err: err, probe: f.probe, fault: flt})
		}
	}
}

// settled gives back the window slot of f, settled for good (sent or
// dead), and, if f was the suspect sent alone, lets the rest follow.
func (s *session) settled(f flight) {
	s.release(&f)
	s.progress.Store(true)
	s.r.brokerTakes()
	if f.probe {
		s.r.suspect, s.r.aloneFirst = 0, false
		close(s.probeOK)
	}
}
