package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeoutbox/outbox/internal/durable"
	"github.com/edgeoutbox/outbox/internal/lease"
	"github.com/edgeoutbox/outbox/internal/sqlconn"

	"github.com/edgeoutbox/outbox/internal/wait"
)

// How the relay tells a message's own failure from an outage
// ("the isolation rule"):
//
//   - Connection refused, timeouts, a lost connection or a missing
//     acknowledgement never count against the messages in flight. The relay
//     remembers the first message that was in flight (the suspect) and, on
//     the next connection, sends it alone before opening the window again.
//   - If that connection is lost too while the suspect is alone in flight —
//     it was written to a fresh connection and no acknowledgement came back —
//     the suspect is charged one attempt. This is how MQTT 3.1.1 brokers
//     refuse a publish (they close the connection), so a message that a
//     broker keeps refusing is parked as dead after MaxAttempts, while a
//     broker that is merely down never sees the message and never charges it.
//   - Slow is not broken. With a publisher whose tokens tell how far their
//     packet has got (ProgressToken; MQTTPublisher's do), a message's AckTimeout
//     counts from when its last byte left, and until then from the last
//     time the connection moved bytes. A connection given up on because it
//     moved no bytes before the message had left (a stall: ErrStalled)
//     charges nothing, even for the suspect: its bytes never got out.
//   - A Publisher error wrapping ErrRejected charges the message at once.
//     The broker refused that message and nothing else (an MQTT 5 PUBACK
//     reason code): the connection is kept, the publishing stops until it
//     is settled — retried when the RetryPolicy says, alone first, or
//     parked as dead — and then flows on. One wrapping ErrUndeliverable too
//     cannot pass by retrying: the default policy parks it at once, and the
//     messages behind it are not held back.
//   - A message that cannot be encoded (a bad topic written by plain SQL, or
//     over the Publisher's SizeLimiter) can never succeed and is treated
//     as one refused for good.
//
// A message that keeps failing holds back the ones after it until it is
// dead, so order holds for everything that is delivered.

// failure is the first thing that went wrong in a session.
type failure struct {
	seq   int64
	last  int64 // a batch's last row's seq; seq for one row
	prio  uint8 // its priority
	err   error
	probe bool
	fault fault // whose fault it was (faultOf)
}

// refused reports whether the message itself was refused: the connection
// stays up, and the message is charged.
func (f *failure) refused() bool { return f.fault == faultMessage || f.fault == faultUndeliverable }

// halts reports whether the failure stops publishing but not the
// connection: a refusal, or the broker saying it is unavailable (if it
// closed the connection too, the connection's watcher ends the session).
func (f *failure) halts() bool { return f.refused() || f.fault == faultBroker }

type session struct {
	r    *Relay
	conn *sqlconn.Conn
	l    *lease.Lease

	ctx    context.Context // parent: cancelled on shutdown
	sctx   context.Context // this connection: cancelled on failure too
	cancel context.CancelCauseFunc
	// dctx is dispatch's: cancelled with sctx, and by a message the broker
	// refused (halt), which stops publishing but keeps the connection.
	dctx context.Context
	halt context.CancelCauseFunc

	flights chan flight
	// slots holds one token per message awaiting its acknowledgement:
	// taken before the publish, given back when the PUBACK (or a failure)
	// comes — MQTT's in-flight window, as Window says.
	slots chan struct{}
	// bytes is the payload bytes of the messages holding a slot, and freed
	// is signalled when it shrinks: WindowBytes.
	bytes atomic.Int64
	freed chan struct{}
	// marks carries acknowledged messages to markLoop, which records them
	// in batches. unmarked holds one token per acknowledged message not yet
	// recorded (markSlots of them at most). A crash can only duplicate a
	// message that holds a token in slots or in unmarked.
	marks    chan mark
	unmarked chan struct{}
	probeOK  chan struct{}

	ledgers [MaxPriority + 1]ledger // which acknowledged rows may be marked, per priority
	lanes   lanes
	scope   scope
	readers sync.WaitGroup // batches read ahead
	gate    *durable.Gate  // a power cut's duplicates within the crash bound
	// props is the publisher's PropertiesPublisher if its connection
	// carries properties (MQTT 5), else nil.
	props    PropertiesPublisher
	progress atomic.Bool

	mu   sync.Mutex
	fail *failure
	// barrier is the seq of the first message that failed in this session
	// (0: none). Only messages before it may be marked: the relay records
	// progress as a high-water mark, and a mark past a failed message would
	// record it as sent.
	barrier int64
}

type sessionResult struct {
	progress bool
	// keep: the session ended on a message the broker refused, and the
	// connection is still up: the next session runs on it.
	keep       bool
	err        error         // why the connection ended; nil on shutdown
	retryAfter time.Duration // minimum wait before reconnecting
	fatal      error         // the relay cannot go on
	// refused is the priority of the message the broker refused, which
	// waits retryAfter; -1 if none was.
	refused int
}

// scope limits a session to the priorities above a refused message that
// waits its retry on the kept connection, until then: they need not wait
// with it. The zero scope is a whole session.
type scope struct {
	floor int       // the lowest priority published
	until time.Time // when the session ends, having nothing above
}

// session publishes over one connection until it fails or ctx ends.
func (r *Relay) session(ctx context.Context, conn *sqlconn.Conn, l *lease.Lease, sc scope) sessionResult {
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	dctx, halt := context.WithCancelCause(sctx)
	defer halt(nil)
	window := r.opts.Window
	if wl, ok := r.pub.(WindowLimiter); ok {
		if n := wl.MaxInFlight(); n > 0 && n < window {
			window = n
		}
	}
	s := &session{
		r: r, conn: conn, l: l,
		ctx: ctx, sctx: sctx, cancel: cancel, dctx: dctx, halt: halt,
		flights:  make(chan flight, window),
		slots:    make(chan struct{}, window),
		freed:    make(chan struct{}, 1),
		marks:    make(chan mark, markSlots(r.opts.Window)),
		unmarked: make(chan struct{}, markSlots(r.opts.Window)),
		probeOK:  make(chan struct{}),
		lanes:    newLanes(sc.floor),
		scope:    sc,
		// It counts MQTT messages: a batch is one (marks.go).
		gate: durable.NewGate(r.syncWAL(), &r.markSyncs, int64(r.opts.Window+markSlots(r.opts.Window))),
	}
	s.props = r.carrier()
	var watcher sync.WaitGroup
	defer watcher.Wait()
	if cl, ok := r.pub.(ConnectionWatcher); ok {
		if lost := cl.ConnectionLost(); lost != nil {
			watcher.Add(1)
			go func() {
				defer watcher.Done()
				select {
				case <-lost:
					cause := errConnectionLost
					if lr, ok := r.pub.(LossExplainer); ok {
						if why := lr.LostReason(); why != nil {
							cause = fmt.Errorf("%w: %w", errConnectionLost, why)
						}
					}
					cancel(cause)
				case <-sctx.Done():
				}
			}()
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.ackLoop() }()
	go func() { defer wg.Done(); s.markLoop() }()
	stopSyncs := make(chan struct{})
	var syncs sync.WaitGroup
	syncs.Add(1)
	go func() {
		defer syncs.Done()
		s.gate.SyncLoop(stopSyncs, func(err error) {
			r.setErr(err)
			r.log.Error("outbox relay cannot make its marks durable", "err", err)
		})
	}()
	fatal := s.dispatch()
	s.readers.Wait()
	close(stopSyncs)
	syncs.Wait()
	if fatal != nil {
		cancel(fatal)
	}
	close(s.flights)
	if ctx.Err() == nil && sctx.Err() != nil {
		// The connection failed: disconnecting completes the tokens still
		// in flight, so the ack loop can finish. After a refusal alone the
		// connection is up, and their acknowledgements come.
		r.pub.Disconnect()
	}
	wg.Wait()
	// Rows acknowledged behind one that failed are sent again: no longer
	// in flight.
	for p := range s.ledgers {
		r.inFlight.Add(-int64(s.ledgers[p].waiting()))
	}
	res := s.result(fatal)
	// The watcher may not yet have seen a connection the broker closed as
	// it said it was unavailable: ask the publisher too.
	res.keep = res.fatal == nil && ctx.Err() == nil && sctx.Err() == nil && dctx.Err() != nil && !r.connectionLost()
	cancel(nil) // ends the watcher
	return res
}

// result settles the session's failure: it charges the message to blame,
// if any, and chooses the suspect for the next connection.
func (s *session) result(fatal error) sessionResult {
	r := s.r
	res := sessionResult{progress: s.progress.Load(), fatal: fatal, refused: -1}
	f := s.fail
	if f == nil {
		if s.ctx.Err() == nil && fatal == nil {
			res.err = context.Cause(s.sctx)
		}
		return res
	}
	res.err = f.err
	batch := f.last > f.seq
	if batch && f.fault != faultNotSent && f.fault != faultStalled && f.fault != faultBroker {
		// A batch that was refused, or in flight first when the
		// connection was lost: its rows go again one by one, the first
		// alone, so that only a row at fault is charged — the broker may
		// have refused the batch for one of them, or for its size.
		r.singly = max(r.singly, f.last)
		r.suspect = f.seq
		return res
	}
	switch {
	case f.refused():
		r.suspect = f.seq
		res.refused = int(f.prio)
		retryAfter, _, err := r.failed(s.conn, f.seq, f.err)
		if err != nil {
			r.writeFailed(err)
		}
		res.retryAfter = retryAfter
	case f.fault == faultNotSent:
		// Nothing reached the broker; the suspect stays as it was.
	case f.fault == faultBroker:
		// The broker spoke of itself, not of the message: nothing is
		// charged and the suspect stays as it was. The next session
		// still sends its first message alone: a broker that takes
		// messages again part way through a window would take the later
		// ones before those it refused, out of order.
		r.aloneFirst = true
	case f.probe && f.seq == r.suspect && f.fault != faultStalled:
		_, dead, err := r.failed(s.conn, f.seq, f.err)
		if err != nil {
			r.writeFailed(err)
		} else if dead {
			r.suspect = 0
		}
	default:
		r.suspect = f.seq
	}
	return res
}

// connectionLost reports whether a ConnectionWatcher's connection is known
// to be lost.
func (r *Relay) connectionLost() bool {
	cl, ok := r.pub.(ConnectionWatcher)
	if !ok {
		return false
	}
	lost := cl.ConnectionLost()
	if lost == nil {
		return false
	}
	select {
	case <-lost:
		return true
	default:
		return false
	}
}

func (s *session) setFail(f failure) {
	s.mu.Lock()
	if s.fail == nil {
		s.fail = &f
	}
	if s.barrier == 0 || f.seq < s.barrier {
		s.barrier = f.seq
	}
	s.mu.Unlock()
	if f.halts() {
		s.halt(f.err)
		return
	}
	s.cancel(f.err)
}

// markable reports whether an acknowledged message may be marked sent:
// whether nothing before it failed.
func (s *session) markable(seq int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.barrier == 0 || seq < s.barrier
}

// dispatch reads pending rows and publishes them, each priority in
// sequence order, the highest first (lanes.go), keeping at most Window
// unacknowledged. It returns when the session ends; a non-nil error means
// the relay cannot go on.
func (s *session) dispatch() error {
	r := s.r
	ls := &s.lanes
	// A scoped session runs on a connection that stays up beside a refused
	// message: nothing to isolate, and that message stays the suspect.
	probe := s.scope.floor == 0 && (r.suspect != 0 || r.aloneFirst)
	// ahead is a lane's next batch, read while this one is published:
	// reading and encoding a batch takes about as long as a window of 64
	// takes to be acknowledged on loopback, so reading in turn let the
	// window run dry once per batch.
	var ahead chan batch
	// aheadNeeded is closed when dispatch wants the batch read ahead: it
	// must then be durable (makeDurable).
	var aheadNeeded chan struct{}
	defer func() {
		if aheadNeeded != nil {
			close(aheadNeeded)
		}
	}()
	woke := false   // the last pick followed a wait for work
	stale := true   // what the lanes know of the outbox must be read again
	asking := false // a commit was seen, and the lanes not yet asked
	defer r.notIdle()
	// slot: a window slot is held for the next hand-off. It is taken
	// before the lane is chosen, so that a higher priority committed while
	// the window was full takes the slot that frees first.
	slot := false
	defer func() {
		if slot {
			<-s.slots
		}
	}()
	for s.dctx.Err() == nil {
		// The lease is checked before each hand-off, below, not here: a
		// wait that ends with nothing to read must not renew a lease
		// that an idle relay let lapse (see keepLease).
		if !slot && !stale {
			if !s.takeSlot() {
				return nil
			}
			slot = true
		}
		if stale || asking || s.committed() {
			// A commit seen while the reader is busy with a read ahead is
			// asked about at the next hand-off, not waited for.
			done, err := s.repick(stale)
			if err != nil {
				if !s.readFailed(err) {
					break
				}
				continue
			}
			stale, asking = false, !done
		}
		p := ls.next()
		if p < 0 && s.scope.floor > 0 {
			// Nothing above the refused message: wait for a commit until
			// its retry is due, then end.
			if slot {
				<-s.slots
				slot = false
			}
			wctx, cancel := context.WithDeadline(s.dctx, s.scope.until)
			r.waitForWork(wctx, r.reader, ls.wake, ls.version)
			cancel()
			if s.dctx.Err() != nil || !time.Now().Before(s.scope.until) {
				break
			}
			stale = true
			continue
		}
		if p < 0 {
			// Before the nudge, which keepLease judges by it.
			r.hearsAll.Store(r.watch.HearsAll(s.l.TTL() / 2))
			if woke {
				// The last wait ended and there was nothing: another
				// connection's commit, perhaps a contender announcing
				// itself to an idle holder (see keepLease).
				select {
				case r.nudge <- struct{}{}:
				default:
				}
			}
			if slot {
				// An idle relay holds no slot: with none taken, the
				// outbox clock stands still (idle).
				<-s.slots
				slot = false
			}
			if !s.idle(ls.wake, ls.version) {
				break
			}
			woke, stale = true, true
			continue
		}
		ln := &ls.l[p]
		if len(ln.queue) == 0 {
			var b batch
			if ls.aheadFor == p {
				close(aheadNeeded)
				b, ahead, aheadNeeded, ls.aheadFor = <-ahead, nil, nil, -1
			} else {
				// A suspect goes out alone and first: read just that row,
				// so that the window in which a network fault is blamed on
				// it is one round trip, not the time it takes to read and
				// encode a whole batch. With priorities, that is the first
				// row of the highest: a suspect of a lower one waits its
				// turn, and holds nothing back.
				limit := r.readSize()
				if probe {
					limit = 1
				}
				b = s.read(p, ln.cursor, limit)
				if !probe {
					b = s.linger(b, ln.cursor, limit)
				}
				s.pack(&b, s.rules(probe))
				s.makeDurable(&b, nil)
			}
			if b.err != nil {
				if !s.readFailed(b.err) {
					break
				}
				stale = true
				continue
			}
			ln.more = b.more
			if len(b.rows) == 0 {
				continue
			}
			woke = false
			r.notIdle()
			last := b.rows[len(b.rows)-1].seq
			if b.more && !probe && ahead == nil && p == ls.top() {
				ahead, aheadNeeded, ls.aheadFor = make(chan batch, 1), make(chan struct{}), p
				s.readers.Add(1)
				go func(after int64, need <-chan struct{}) {
					defer s.readers.Done()
					ahead <- s.fetch(p, after, r.readSize(), s.rules(false), need)
				}(last, aheadNeeded)
			}
			ln.cursor = max(ln.cursor, last)
			s.ledgers[p].add(b.rows)
			for i := range b.parcels {
				ln.queue = append(ln.queue, queued{&b.parcels[i], b.rules})
			}
		}
		q := ln.queue[0]
		ln.queue[0] = queued{}
		ln.queue = ln.queue[1:]
		pc := q.p
		m := pc.first()
		if m.encErr == nil {
			r.seal(pc, q.rules)
		}
		if m.encErr != nil {
			parked, err := r.refusedForGood(s.conn, m.seq, m.id, m.topic, m.attempts, m.encErr)
			switch {
			case err != nil:
				// It stays pending and nothing after it may be
				// marked: end the session, and try again on the next.
				r.writeFailed(err)
				s.setFail(failure{seq: m.seq, err: err, fault: faultNotSent})
				return nil
			case !parked:
				// The policy wants it tried again: charged, as a
				// message the broker refused.
				s.setFail(failure{seq: m.seq, prio: m.priority, err: m.encErr, fault: faultOf(m.encErr)})
				return nil
			}
			s.flights <- flight{seq: m.seq, prio: m.priority, parked: true}
			continue
		}
		if !slot && !s.takeSlot() {
			return nil
		}
		slot = false // the flight's now: the ack loop gives it back
		if !s.gate.Admit(s.dctx) {
			return nil
		}
		if h := r.hooks.beforeHandOff; h != nil {
			h(m.seq)
		}
		// Checked before every hand-off, not once per batch: a relay
		// stopped (SIGSTOP, a frozen VM) for longer than the TTL while
		// another took over would otherwise, on waking, publish the
		// rest of its batch before its renewal told it the lease was
		// gone. It costs a mutex and a monotonic clock read.
		for !s.l.Valid() {
			if !s.l.WaitValid(s.dctx, s.l.TTL()/16) {
				return nil
			}
		}
		if len(pc.rows) == 1 {
			// Only a row with an expiry has one, and it goes alone.
			if publish, ok := s.atItsTurn(m, pc); !ok {
				return nil
			} else if !publish {
				s.flights <- flight{seq: m.seq, prio: m.priority, parked: true}
				continue // parked expired (expiry.go)
			}
		}
		f := newFlight(pc, s.publish(pc), probe)
		// Before the ack loop has the flight, which gives the bytes back.
		s.bytes.Add(int64(f.bytes))
		r.inFlight.Add(int64(len(pc.rows)))
		s.flights <- f
		if probe {
			select {
			case <-s.probeOK:
			case <-s.dctx.Done():
				return nil
			}
			probe = false
		}
	}
	return nil
}

// takeSlot takes a window slot, then waits until fewer than WindowBytes
// payload bytes are in flight; false when dispatch ends first.
func (s *session) takeSlot() bool {
	select {
	case s.slots <- struct{}{}:
	case <-s.dctx.Done():
		return false
	}
	for limit := int64(s.r.opts.WindowBytes); limit > 0; {
		n := s.bytes.Load()
		if n < limit {
			break
		}
		if h := s.r.hooks.onWindowBytes; h != nil {
			h(n)
		}
		select {
		case <-s.freed:
		case <-s.dctx.Done():
			<-s.slots
			return false
		}
	}
	return true
}

// release gives back the window slot and the bytes of f.
func (s *session) release(f *flight) {
	<-s.slots
	s.bytes.Add(-int64(f.bytes))
	select {
	case s.freed <- struct{}{}:
	default:
	}
}

// readFailed reports a failed read, and waits a second before the next
// unless the session ends (false).
func (s *session) readFailed(err error) bool {
	if s.dctx.Err() != nil {
		return false
	}
	s.r.setErr(err)
	s.r.log.Error("outbox relay cannot read the outbox", "err", err)
	return wait.Sleep(s.dctx, time.Second, nil)
}

// linger waits, with Batch.MaxDelay, for more rows to join the batches
// of a read that holds too few to fill one: until a batch would be full,
// or MaxDelay after the read that first found rows. It reads again after
// every commit meanwhile; rows are made durable only once, after.
func (s *session) linger(b batch, cursor int64, limit int) batch {
	r := s.r
	bo := r.opts.Batch
	if bo.MaxDelay <= 0 || !bo.on() || b.err != nil || len(b.rows) == 0 {
		return b
	}
	deadline := time.Now().Add(bo.MaxDelay)
	for len(b.rows) < limit && !s.fills(b.rows) {
		ctx, cancel := context.WithDeadline(s.dctx, deadline)
		woke := r.waitForWork(ctx, r.reader, b.wake, b.version)
		cancel()
		if s.dctx.Err() != nil {
			return b
		}
		if nb := s.read(b.prio, cursor, limit); nb.err == nil {
			b = nb
		}
		if !woke {
			break
		}
		// A higher priority committed meanwhile goes first: stop waiting.
		if _, err := s.repick(true); err == nil && s.lanes.top() > b.prio {
			break
		}
	}
	return b
}

// fills reports whether rows fill a batch of one topic, or would make one
// of more than half MaxBytes.
func (s *session) fills(rows []row) bool {
	bo := s.r.opts.Batch
	n, size := map[string]int{}, map[string]int{}
	for i := range rows {
		m := &rows[i]
		n[m.topic]++
		size[m.topic] += len(m.encoded)
		if n[m.topic] >= bo.MaxEvents || 2*size[m.topic] > bo.MaxBytes {
			return true
		}
	}
	return false
}

// idle waits for work (see waitForWork), saying so for keepLease. With
// nothing in flight the outbox clock stands still meanwhile: no message's
// life is running (every pending one was read, and published or parked),
// and so the idle relay need not store the clock for other processes'
// writers, which stamp from the stored one; it catches up with what
// another process stored when it wakes.
func (s *session) idle(wake <-chan struct{}, version int64) bool {
	r := s.r
	// Waiting since the last batch with rows: a wait that ended with
	// nothing to read is no work.
	r.idleSince.CompareAndSwap(0, max(int64(time.Since(r.epoch)), 1))
	if len(s.slots) != 0 {
		return r.waitForWork(s.dctx, r.reader, wake, version)
	}
	r.ob.clock.Pause()
	ok := r.waitForWork(s.dctx, r.reader, wake, version)
	if r.ob.clock.Resume() >= time.Second && ok {
		err := r.reader.Do(func(c *sql.Conn) error {
			ms, err := readOutboxClock(s.dctx, c)
			if err == nil {
				r.ob.clock.CatchUp(ms)
			}
			return err
		})
		if err != nil && s.dctx.Err() == nil {
			r.log.Debug("outbox relay could not read the outbox clock", "err", err)
		}
	}
	return ok
}

// notIdle ends an idle spell: rows came, or the session ended. keepLease,
// which may have stopped renewing, is told.
func (r *Relay) notIdle() {
	if r.idleSince.Swap(0) != 0 {
		select {
		case r.working <- struct{}{}:
		default:
		}
	}
}

// publish hands p to the publisher, with its properties if it has any and
// the connection carries them.
func (s *session) publish(p *parcel) Token {
	if s.props != nil && !p.props.empty() {
		return s.props.PublishWithProperties(p.topic, p.payload, p.props)
	}
	return s.r.pub.Publish(p.topic, p.payload)
}

// rules are how this session packs rows into parcels (batch.go).
func (s *session) rules(probe bool) parcelRules {
	r := s.r
	carries := s.props != nil
	return parcelRules{
		// A raw batch is told by its MQTT 5 Content Type alone.
		batch:   r.opts.Batch.on() && (carries || r.opts.Envelope != EnvelopeRaw),
		carries: carries,
		singly:  r.singly,
		probe:   probe,
	}
}

// readSize is how many rows a read takes: with batching, enough for
// several full batches, so that a backlog is read, and made durable, in
// few reads.
func (r *Relay) readSize() int {
	if !r.opts.Batch.on() {
		return r.opts.ReadSize
	}
	return max(r.opts.ReadSize, min(16*r.opts.Batch.MaxEvents, 4096))
}

// carrier returns the publisher as a PropertiesPublisher if its connection
// carries properties, else nil. In binary mode a connection that does not
// is logged once per fallback — when the relay first finds itself without
// properties, and again only after a connection that had them — so that a
// relay on 3.1.1 for good says it once, not at every reconnection.
func (r *Relay) carrier() PropertiesPublisher {
	pp, ok := r.pub.(PropertiesPublisher)
	carries := ok && pp.CarriesProperties()
	if r.opts.Envelope == EnvelopeCloudEventsBinary {
		if carries {
			r.structured.Store(false)
		} else if !r.structured.Swap(true) {
			why := "the connection speaks MQTT 3.1.1"
			if !ok {
				why = "the Publisher cannot send MQTT 5 properties"
			}
			r.log.Warn("outbox relay: CloudEvents binary mode needs MQTT 5 properties and "+why+"; publishing structured mode until a connection carries them",
				"protocol", r.Protocol())
		}
	}
	if r.opts.Envelope == EnvelopeRaw && (r.opts.Batch.on() || r.opts.Compress != nil) {
		if carries {
			r.rawPlain.Store(false)
		} else if !r.rawPlain.Swap(true) {
			r.log.Warn("outbox relay: a raw batch or a compressed raw payload is told only by MQTT 5 properties; publishing raw events one by one, uncompressed, until a connection carries them",
				"protocol", r.Protocol())
		}
	}
	if !carries {
		return nil
	}
	return pp
}
