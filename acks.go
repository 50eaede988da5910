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

// flight is a publish awaiting its acknowledgement.
type flight struct {
	seq   int64
	id    string
	topic string
	tok   Token
	sent  time.Time
	probe bool
	// created is the row's created_at (Unix ms), for the commit-to-PUBACK
	// histogram.
	created int64
	// attempts is the row's failed attempts before this one.
	attempts int
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
	for f := range s.flights {
		if abandoned {
			r.inFlight.Add(-1)
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
				s.setFail(failure{seq: f.seq, err: cause, probe: f.probe, fault: flt})
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
			r.inFlight.Add(-1)
			<-s.slots
			continue
		}
		if err == nil {
			r.acked(f.sent, f.created)
			if nt, ok := f.tok.(NoSubscribersToken); ok && nt.NoSubscribers() {
				r.heardByNobody(f.topic)
			}
			// Waits while markSlots acknowledged messages are not yet
			// recorded: marks that lag hold back publishing.
			s.unmarked <- struct{}{}
			s.marks <- f.seq
			s.settled(f)
			continue
		}
		flt := faultOf(err)
		if !abandoned && flt == faultUndeliverable && s.markable(f.seq) {
			// Refused for good, on a connection that stays up: parked at
			// once, and nothing behind it need wait or go again.
			parked, perr := r.refusedForGood(s.conn, f.seq, f.id, f.topic, f.attempts, err)
			if parked {
				r.inFlight.Add(-1)
				s.gate.Settle(1)
				s.settled(f)
				continue
			}
			// Not recorded, or the policy wants it retried: it goes
			// through the charge below instead.
			if perr != nil {
				r.writeFailed(perr)
			}
		}
		r.inFlight.Add(-1)
		<-s.slots
		if !abandoned {
			s.setFail(failure{seq: f.seq, err: err, probe: f.probe, fault: flt})
		}
	}
}

// settled gives back the window slot of f, settled for good (sent or
// dead), and, if f was the suspect sent alone, lets the rest follow.
func (s *session) settled(f flight) {
	<-s.slots
	s.progress.Store(true)
	s.r.brokerTakes()
	if f.probe {
		s.r.suspect, s.r.aloneFirst = 0, false
		close(s.probeOK)
	}
}
