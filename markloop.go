package outbox

import "time"

// markLoop records acknowledged messages as sent, many per statement.
func (s *session) markLoop() {
	r := s.r
	batch := make([]int64, 0, maxMarkBatch)
	// A mark costs about 34 µs however many messages it records
	// (BenchmarkMarkSent64): when few acknowledgements are queued, wait a
	// moment for more, so that a fast stream is recorded in batches, not
	// one mark per PUBACK. Nothing waits on a mark but the unmarked slots,
	// of which half stay free.
	enough := max(cap(s.unmarked)/2, 1)
	wait := time.NewTimer(0)
	defer wait.Stop()
	for seq := range s.marks {
		batch = append(batch[:0], seq)
		wait.Reset(markDelay)
	more:
		for len(batch) < maxMarkBatch {
			select {
			case seq, ok := <-s.marks:
				if !ok {
					break more
				}
				batch = append(batch, seq)
				continue
			default:
			}
			if len(batch) >= enough {
				break
			}
			select {
			case seq, ok := <-s.marks:
				if !ok {
					break more
				}
				batch = append(batch, seq)
			case <-wait.C:
				break more
			}
		}
		wait.Stop()
		for attempt := 0; ; attempt++ {
			// Marks arrive in sequence order and only while nothing
			// before them failed: everything up to the last is settled.
			err := r.markSent(s.conn, batch)
			if err == nil {
				s.gate.Settle(int64(len(batch)))
				if r.diskFull.Load() {
					r.wakePurge()
				}
				break
			}
			if r.markFailed(err) {
				continue // space was freed: try again at once
			}
			r.log.Error("outbox relay cannot mark messages sent", "err", err, "rows", len(batch))
			if s.ctx.Err() != nil && attempt >= 3 {
				// Shutting down: the rows stay pending and are sent again
				// by the next relay (a duplicate, never a loss).
				break
			}
			time.Sleep(min(time.Duration(attempt+1)*100*time.Millisecond, 2*time.Second))
		}
		n := int64(len(batch))
		r.inFlight.Add(-n)
		for range batch {
			<-s.unmarked
		}
	}
}
