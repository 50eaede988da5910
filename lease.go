package outbox

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"time"

	"github.com/edgeoutbox/outbox/internal/lease"
	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// idleBefore reports whether the relay has been waiting for work since
// before t.
func (r *Relay) idleBefore(t time.Time) bool {
	since := r.idleSince.Load()
	return since > 0 && !t.IsZero() && r.epoch.Add(time.Duration(since)).Before(t)
}

// keepLease renews the lease every quarter TTL; losing it stops the relay.
// A renewal that fails is a write that failed: on a full disk it spends the
// reserve like any other, and it is tried again soon, because the relay
// stops publishing once it has not renewed for half a TTL.
//
// A relay connected and waiting for work since before its last renewal
// renews less: the renewals are most of what an idle relay costs (FLEET.md:
// hundreds of idle relays in one process), and it publishes nothing that
// needs the lease valid. The first message after the lease lapsed asks for
// a renewal at once (Lease.WaitValid), a write before it is published.
//   - One that would hear any other connection's commit within half a TTL
//     (hearsAll: it watches the WAL and its index) does not renew at all.
//     A contender must announce itself with a write before it counts the
//     holder's silence (lease.announce); the wait ends at that commit, and
//     a wait that ends with nothing to read nudges a renewal.
//   - Any other renews every half TTL instead of every quarter. A contender
//     still never sees the token stand still for a whole TTL; its margin for
//     a late renewal is half a TTL instead of three quarters.
func (r *Relay) keepLease(ctx context.Context, l *lease.Lease, stop context.CancelCauseFunc) {
	t := time.NewTimer(l.TTL() / 4)
	defer t.Stop()
	var lastWarn time.Time
	var lastMsg string
	quick := false  // the last attempt was an immediate retry
	parked := false // idle and hearing all: the timer is not set
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.Lost():
			r.log.Error("outbox relay found its lease taken by another relay when it wrote; stopping")
			stop(ErrLeaseLost)
			return
		case <-t.C:
			// A relay that has waited for work since before its last
			// renewal, which succeeded, skips (the test is against less
			// than half a TTL, for the timer's lateness: the second tick
			// after a renewal renews). Not one that waits between
			// messages: its lease would lapse as it renews, and a renewal
			// waiting for the write lock behind a busy writer would hold
			// its next message.
			last := l.LastRenewal()
			if r.idleBefore(last) && lastMsg == "" && r.hearsAll.Load() {
				// Parked: no timer until work, a contender or a kick.
				call(r.hooks.onSkip)
				parked = true
				continue
			}
			if r.idleBefore(last) && lastMsg == "" && time.Since(last) < l.TTL()/2-l.TTL()/8 {
				call(r.hooks.onSkip)
				t.Reset(l.TTL() / 4)
				continue
			}
		case <-r.notesNew:
			r.recordNotes(ctx, l)
			continue
		case <-r.working:
			// Rows after an idle spell, or the session ended: renew as a
			// busy relay does.
			if !parked {
				continue
			}
			parked = false
			if d := l.TTL()/4 - time.Since(l.LastRenewal()); d > 0 {
				t.Reset(d)
				continue
			}
		case <-r.nudge:
			// Another connection committed and there was nothing to read:
			// a contender announcing itself, perhaps. (Or the relay's own
			// commits: its reader may be a connection of its own.) A
			// parked relay that no longer hears all goes back to the timer.
			switch {
			case lastMsg != "":
				continue
			case !r.hearsAll.Load():
				if !parked {
					continue
				}
			case !l.AnnouncedSince(ctx):
				continue
			}
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		case <-l.Kicked():
			if l.Valid() {
				continue // renewed since it was asked
			}
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		}
		next := l.TTL() / 4
		// Riding on the renewal: writers in other processes stamp
		// expiries with the stored outbox clock. Not on a full disk: its
		// page would take the space the marks need.
		var clock func(context.Context, sqlconn.Prepared) error
		if _, due := r.ob.clock.Due(); due && !r.diskFull.Load() {
			clock = func(ctx context.Context, p sqlconn.Prepared) error { return r.ob.storeClock(ctx, p) }
		}
		r.own.Started.Add(1)
		clockErr, err := l.Renew(ctx, clock)
		if clockErr != nil && ctx.Err() == nil {
			r.log.Debug("outbox relay could not store the outbox clock", "err", clockErr)
		}
		if err == nil {
			r.own.Done.Add(1) // renew changed the row: it committed
		} else {
			r.own.Started.Add(-1)
		}
		switch {
		case errors.Is(err, lease.ErrLost):
			r.log.Error("outbox relay lost its lease; stopping")
			stop(ErrLeaseLost)
			return
		case err != nil && ctx.Err() == nil:
			err = classifyWriteErr(err)
			// Retried every TTL/16 on a disk that stays full: warn when it
			// starts, when the reason changes, and once a minute.
			level := slog.LevelDebug
			if msg := err.Error(); msg != lastMsg || time.Since(lastWarn) >= time.Minute {
				level, lastMsg, lastWarn = slog.LevelWarn, msg, time.Now()
			}
			r.log.Log(ctx, level, "outbox relay could not renew its lease", "err", err)
			next = l.TTL() / 16
			freed := r.writeFailed(err)
			// Each renewal appends a page to the WAL, and only a complete
			// checkpoint lets SQLite write the WAL from its start again:
			// an idle relay would spend the reserve in minutes, then lose
			// its lease on a disk that stays full. So, while no marks need
			// the space, copy the WAL into the database now, with the
			// reserve's space; from then on renewals take none.
			ckpt := errors.Is(err, ErrDiskFull) && !r.connected.Load() && (freed || !quick) && walCheckpointed(ctx, l.Conn())
			if ckpt {
				r.log.Info("outbox: disk full; copied the WAL into the database, so that lease renewals need no new space")
			}
			if freed || ckpt {
				next = 0
			}
		default:
			lastMsg = ""
			r.metrics.writeFailed.Store(false)
			if r.noSubscribers.unrecorded() {
				// Riding on the renewal too: the count the lease shows
				// lags by a renewal at most while messages flow.
				r.recordNotes(ctx, l)
			}
		}
		quick, parked = next == 0, false
		t.Reset(next)
	}
}

// leaseGone is for a state write that changed nothing: it returns
// ErrLeaseLost when the reason is that the lease is no longer this relay's
// (lease.HeldSQL), and then tells the keeper, which stops the relay. c is
// the relay's connection the write ran on.
func (r *Relay) leaseGone(ctx context.Context, c *sql.Conn) error {
	held, err := r.lease.Held(ctx, c)
	if err != nil {
		return err
	}
	if held {
		return nil
	}
	r.lease.Lose()
	return ErrLeaseLost
}

// notesChanged asks keepLease to record the lease.Notes in the lease,
// for `outboxctl status`: once per change, not per message or session (and
// for messages taken with no subscriber, once per warning).
func (r *Relay) notesChanged() {
	select {
	case r.notesNew <- struct{}{}:
	default:
	}
}

// recordNotes writes what the broker says, and what it took with no
// subscriber, into the lease.
func (r *Relay) recordNotes(ctx context.Context, l *lease.Lease) {
	var n lease.Notes
	n.BrokerSays, n.BrokerSince = r.brokerSays()
	n.NoSubscribers, n.NoSubscribersTopic, n.NoSubscribersAt = r.noSubscribers.read()
	r.own.Started.Add(1)
	err := l.SetNotes(ctx, n)
	if err != nil {
		r.own.Started.Add(-1)
		if ctx.Err() == nil {
			r.log.Warn("outbox relay could not record in the lease what the broker says", "err", err)
		}
		return
	}
	r.own.Done.Add(1)
	r.noSubscribers.recorded.Store(n.NoSubscribers)
}
