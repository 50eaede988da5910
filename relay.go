package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/edgeoutbox/outbox/internal/compress"
	"github.com/edgeoutbox/outbox/internal/durable"
	"github.com/edgeoutbox/outbox/internal/lease"
	"github.com/edgeoutbox/outbox/internal/sqlconn"
	"github.com/edgeoutbox/outbox/internal/walwatch"

	"github.com/edgeoutbox/outbox/internal/wait"
)

// RelayOptions configures a Relay. The zero value is ready to use.
type RelayOptions struct {
	// Envelope is what goes on the wire; CloudEvents unless set.
	Envelope Envelope
	// Source is the CloudEvents source, naming this device: valid UTF-8
	// without NUL, at most 1,024 bytes. Default: "/outbox/" + the host
	// name.
	Source string
	// DefaultType is the CloudEvents type of messages enqueued without one,
	// as Source is checked. Default: DefaultEventType.
	DefaultType string
	// Window is how many messages may await their acknowledgement at once:
	// MQTT's in-flight window. Default 64; at most 65,535 (MQTT packet ids).
	// A broker's lower MQTT 5 Receive Maximum is the limit on its
	// connection.
	// Acknowledged messages are recorded as sent in batches, with at most
	// max(Window, 256) waiting for that. A crash can duplicate only those
	// two groups: at most Window + max(Window, 256) messages (320 by
	// default).
	Window int
	// WindowBytes is how many bytes of payload may await their
	// acknowledgement at once, beside Window: the relay hands off a message
	// only while fewer are in flight (so one larger goes alone). On a slow
	// link a higher priority committed during a drain then waits behind
	// about this many bytes, not a window of large batches. Default 256 KiB:
	// seven times what a 2 Mbit/s link with a 150 ms round trip carries in
	// a round trip, and four times a window of 64 one-event messages of 1
	// KiB; a link that carries more in a round trip needs more to be kept
	// full. Negative: Window alone.
	WindowBytes int
	// ReadSize is how many rows are read from the database at a time.
	// Default 256; with Batch on, at least 16 × Batch.MaxEvents (up to
	// 4,096), so that a backlog is read, and made durable, in few reads.
	ReadSize int
	// AckTimeout is how long a publish may wait for its acknowledgement on
	// a connection that is still up before the connection is deemed broken.
	// With a Publisher whose tokens tell when their bytes have left (the
	// MQTTPublisher's do), it counts from then, and before then from the
	// last time the connection moved any bytes: a slow link is never taken
	// for a broken one, and never charges a message. Default 30 s.
	AckTimeout time.Duration
	// Reconnect is the backoff between connection attempts. It never gives
	// up; RelayOptions.Reconnect.Max is the cap (default 30 s).
	Reconnect Backoff
	// Retry decides what becomes of a message that failed by itself: when
	// it goes again, and when it is parked as dead. Outages never count.
	// Default: DefaultRetryPolicy{} (5 attempts, 1 s to 1 min apart).
	Retry RetryPolicy
	// PollInterval is how often the relay checks whether another connection
	// or process committed (SQLite's PRAGMA data_version, a cheap call)
	// where it cannot watch the WAL. On Linux it watches it (inotify, one
	// instance per process) and looks when the file is written, then at
	// growing intervals up to 5 s: no polling while idle. Commits
	// through Outbox.Transact wake the relay at once. Default 2 ms.
	PollInterval time.Duration
	// Retention is how long sent rows are kept (for inspection) before
	// they are deleted. Default 1 h. Negative deletes rows as soon as they
	// are acknowledged.
	Retention time.Duration
	// PurgeInterval is how often sent rows past retention are deleted.
	// Default: a tenth of Retention, between 1 s and 1 min.
	PurgeInterval time.Duration
	// LeaseTTL bounds how long a crashed relay blocks a successor (one on
	// the same host that can tell the holder is dead takes over at once).
	// The holder renews every quarter TTL; while idle, less or not at all
	// (docs/delivery.md, "One relay per database"). Default 10 s.
	LeaseTTL time.Duration
	// ShutdownTimeout bounds the wait for in-flight acknowledgements when
	// the relay stops. Default 5 s.
	ShutdownTimeout time.Duration
	// TopicPrefix, if set, is where every topic must start: a message
	// outside it — written by plain SQL or another language, where
	// Options.TopicPrefix cannot check — is parked as dead at once instead
	// of being published where the broker might drop it.
	TopicPrefix string
	// Owner names this relay in the lease. Default: host name, process id
	// and a random suffix.
	Owner string
	// WritersAtFull declares that every connection that writes to this
	// database — this process's and every other's, a sidecar's writers in
	// other languages included — commits at synchronous=FULL (or EXTRA).
	// Such a COMMIT syncs the WAL before its rows become visible, so a row
	// the relay can see is on the disk already, and the relay publishes it
	// without an fsync of its own first: a sidecar writer's commit → PUBACK
	// no longer waits for one (a few hundred µs to several ms on flash and
	// virtual disks). The relay's own marks are synced as before. Without
	// it, only the rows Transact committed on an Outbox opened at SyncFull
	// go out unsynced. Declared wrongly — one writer at NORMAL, which many
	// applications choose for WAL — a power cut can undo a row after the
	// broker had its event: a phantom. NewRelay refuses it on an Outbox
	// that Open opened at SyncNormal.
	WritersAtFull bool
	// Batch publishes many events of one topic per MQTT message; off by
	// default. See BatchOptions.
	Batch BatchOptions
	// Compress, if set (compression.Zstd() or compression.Gzip()),
	// compresses batches, and single events of 256 bytes or more, where
	// that makes them smaller: over MQTT 5 a content-encoding user property
	// says so; over 3.1.1 only structured CloudEvents can be compressed,
	// told by the payload's magic bytes (docs/batching.md).
	Compress Compressor
}

func (o RelayOptions) withDefaults() (RelayOptions, error) {
	if o.TopicPrefix != "" {
		if err := validatePrefix(o.TopicPrefix); err != nil {
			return o, err
		}
	}
	if o.Window == 0 {
		o.Window = 64
	}
	if o.Window < 1 || o.Window > 65535 {
		return o, fmt.Errorf("outbox: relay: Window %d outside 1..65535", o.Window)
	}
	if o.WindowBytes == 0 {
		o.WindowBytes = 256 << 10
	}
	if o.ReadSize <= 0 {
		o.ReadSize = 256
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = 30 * time.Second
	}
	if o.Retry == nil {
		o.Retry = DefaultRetryPolicy{}
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 2 * time.Millisecond
	}
	if o.Retention == 0 {
		o.Retention = time.Hour
	}
	if o.PurgeInterval <= 0 {
		o.PurgeInterval = min(max(o.Retention/10, time.Second), time.Minute)
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 10 * time.Second
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 5 * time.Second
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	if o.Source == "" {
		o.Source = "/outbox/" + host
	}
	if o.DefaultType == "" {
		o.DefaultType = DefaultEventType
	}
	// Every event carries both, and a metric label the source: one that is
	// not valid UTF-8 would park every message dead, or silently empty
	// /metrics (client_golang refuses the label), so it is refused here,
	// where it is a clear error at start.
	for _, a := range []struct{ name, v string }{{"Source", o.Source}, {"DefaultType", o.DefaultType}} {
		if len(a.v) > maxTypeBytes || !utf8.ValidString(a.v) || strings.IndexByte(a.v, 0) >= 0 {
			return o, fmt.Errorf("outbox: relay: %s %.64q must be valid UTF-8 without NUL, of at most %d bytes", a.name, a.v, maxTypeBytes)
		}
	}
	var err error
	if o.Batch, err = o.Batch.check(); err != nil {
		return o, err
	}
	if o.Compress != nil {
		if e := o.Compress.ContentEncoding(); e != compress.Zstd.String() && e != compress.Gzip.String() {
			return o, fmt.Errorf("outbox: relay: Compress: content encoding %q is not one a consumer reads (zstd or gzip: package compression)", e)
		}
	}
	if o.Owner == "" {
		o.Owner = host + ":" + strconv.Itoa(os.Getpid()) + ":" + NewID()[24:]
	}
	return o, nil
}

// Relay drains the outbox to a Publisher in sequence (commit) order. Create
// one with Outbox.NewRelay and call Run.
type Relay struct {
	ob   *Outbox
	pub  Publisher
	opts RelayOptions
	enc  encoder
	comp Compressor // nil: not compressed
	log  *slog.Logger
	kick chan struct{} // ReconnectNow: ends the reconnection wait

	mu       sync.Mutex
	running  bool
	cancel   context.CancelCauseFunc
	lastErr  error
	errAt    time.Time
	lastAck  time.Time
	protocol string // what the publisher said it speaks (ProtocolNamer)
	said     brokerSaid

	unavailable atomic.Bool   // said.says != "": checked at every acknowledgement
	notesNew    chan struct{} // what the lease tells status changed: keepLease records it (lease.Notes)

	connected atomic.Bool
	diskFull  atomic.Bool   // a write failed for lack of space: purge now
	purgeNow  chan struct{} // wakes the purge loop
	inFlight  atomic.Int64
	sent      atomic.Int64
	dead      atomic.Int64
	expired   atomic.Int64

	// suspect is the sequence number of the first message that was in
	// flight when the last connection failed; zero if none. The next
	// connection sends it alone first (see session).
	suspect int64
	// aloneFirst: the last session ended as the broker said it is
	// unavailable; the next sends its first message alone, uncharged.
	aloneFirst bool
	// singly: rows up to this seq were in a batch that failed; they go
	// one by one (batch.go).
	singly int64

	// reader is the connection fetch and the data_version polls use: the
	// relay's own, or a second one (see run).
	reader *sqlconn.Conn
	// lease is the relay's lease while Run holds it: every state write
	// checks it in SQL (lease.HeldSQL).
	lease *lease.Lease

	// wal makes what a batch read durable before it is published
	// (internal/durable).
	wal       *durable.Syncer
	markSyncs atomic.Int64 // RelayStats.MarkSyncs

	// watch, while Run runs, tells when another connection or process may
	// have committed (internal/walwatch); own counts the relay's own
	// commits it may discount: lease renewals.
	watch *walwatch.Watch
	own   walwatch.Own
	// idleSince is when the relay, connected, began to wait for work (on
	// the monotonic clock, since epoch; 0: it is not waiting). One that
	// has waited since before its last renewal renews less often, or not
	// at all while hearsAll (keepLease). hearsAll: the wait would notice any other
	// connection's commit within half a TTL (it watches the WAL and its
	// index). nudge tells keepLease of a wait that ended with nothing to
	// read: another connection's commit, perhaps a contender's.
	epoch     time.Time
	idleSince atomic.Int64
	hearsAll  atomic.Bool
	nudge     chan struct{}
	working   chan struct{} // an idle spell ended (notIdle)
	hooks     relayHooks
	metrics   relayMetrics // Metrics
	// structured: binary mode was asked for, and the last session could
	// not carry properties (said once per fallback: carrier).
	structured atomic.Bool
	// rawPlain: raw batching or compression was asked for, and the last
	// session could not carry properties (said once per fallback).
	rawPlain atomic.Bool

	noSubscribers noSubscribers // taken with no subscriber (nosubscribers.go)
}

// NewRelay returns a relay that drains this outbox to pub.
func (o *Outbox) NewRelay(pub Publisher, opts RelayOptions) (*Relay, error) {
	if pub == nil {
		return nil, fmt.Errorf("outbox: relay: nil Publisher")
	}
	if o.readOnly {
		return nil, fmt.Errorf("outbox: relay: %w", ErrReadOnly)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := unmarkedPayloads(pub, opts); err != nil {
		return nil, err
	}
	if opts.WritersAtFull && o.ownsDB && !o.durable.Full {
		return nil, errors.New("outbox: relay: WritersAtFull on an Outbox opened at SyncNormal: its own commits are not synced")
	}
	r := &Relay{
		ob:       o,
		pub:      pub,
		opts:     opts,
		enc:      encoder{prefix: opts.TopicPrefix, mode: opts.Envelope, source: opts.Source, defaultType: opts.DefaultType},
		log:      o.log.With("relay", opts.Owner),
		kick:     make(chan struct{}, 1),
		purgeNow: make(chan struct{}, 1),
		nudge:    make(chan struct{}, 1),
		working:  make(chan struct{}, 1),
		notesNew: make(chan struct{}, 1),
		wal:      &durable.Syncer{Path: o.path + "-wal"},
	}
	r.comp = opts.Compress
	r.enc.sizes, _ = pub.(SizeLimiter)
	r.enc.topics, _ = pub.(TopicChecker)
	if r.enc.sizes != nil {
		// The stored limit is the core's; a transport may carry less. Said
		// once, at start, rather than learnt from dead messages.
		worst := maxEncodedBytes(o.maxPayload)
		if err := r.enc.sizes.CheckSize(strings.Repeat("t", maxTopicBytes), worst, &PublishProperties{ContentType: structuredContentType, MessageExpiry: time.Hour}); err != nil {
			r.log.Warn("outbox relay: the payload limit stored in the database lets in messages this transport cannot carry; they will be parked dead: lower it (Options.MaxPayloadBytes, outboxctl init --max-payload-bytes)",
				"max_payload_bytes", o.maxPayload, "worst_encoded_bytes", worst, "err", err)
		}
	}
	r.epoch = time.Now()
	return r, nil
}

// ReconnectNow skips the rest of the current reconnection wait: call it
// when the application learns that the network is back.
func (r *Relay) ReconnectNow() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *Relay) setErr(err error) {
	r.mu.Lock()
	r.lastErr, r.errAt = err, r.ob.now()
	r.mu.Unlock()
}

// stop is called by Outbox.Close.
func (r *Relay) stop() {
	r.mu.Lock()
	if r.cancel != nil {
		r.cancel(ErrClosed)
	}
	r.mu.Unlock()
}

// Run drains the outbox until ctx ends (cancelled, or its deadline passed)
// or the Outbox is closed, then waits (at most ShutdownTimeout) for
// in-flight acknowledgements and returns nil. It first waits for the relay
// lease, so a second relay on the same database waits until the first
// stops. Run returns an error only when the relay cannot go on: the lease
// was lost (ErrLeaseLost), or the database failed.
func (r *Relay) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return fmt.Errorf("outbox: relay: Run called twice")
	}
	r.ob.mu.Lock()
	if r.ob.closed {
		r.ob.mu.Unlock()
		r.mu.Unlock()
		return ErrClosed
	}
	ctx, cancel := context.WithCancelCause(ctx)
	r.running, r.cancel = true, cancel
	r.ob.relays[r] = struct{}{}
	r.ob.relayWG.Add(1)
	r.ob.mu.Unlock()
	r.mu.Unlock()
	defer func() {
		cancel(nil)
		r.ob.mu.Lock()
		delete(r.ob.relays, r)
		r.ob.mu.Unlock()
		r.mu.Lock()
		r.running, r.cancel = false, nil
		r.mu.Unlock()
		r.ob.relayWG.Done()
	}()
	// However ctx ended (a deadline, a cause of the caller's), it is how
	// the caller stops the relay, not a failure: a program that runs the
	// relay for a while must not exit through its error path.
	return r.run(ctx)
}

func (r *Relay) run(ctx context.Context) error {
	conn, err := sqlconn.Open(ctx, r.ob.db)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return fmt.Errorf("outbox: relay: %w", err)
	}
	defer conn.Close()
	defer r.wal.Close()
	// Reads get a connection of their own when the pool allows it, so that
	// publishing never waits behind a mark that waits for the write lock
	// (in WAL, reads never wait for writers).
	reader := conn
	if max := r.ob.db.Stats().MaxOpenConnections; max == 0 || max >= 3 {
		rc, err := r.ob.db.Conn(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("outbox: relay: %w", err)
		}
		reader = sqlconn.Reader(rc, conn)
		defer reader.Close()
	}
	r.reader = reader
	wopts := r.hooks.watch
	wopts.PollInterval, wopts.Own, wopts.Log = r.opts.PollInterval, &r.own, r.log
	r.watch = walwatch.Open(r.ob.path, wopts)
	defer r.watch.Close()
	l := lease.New(conn, r.opts.Owner, r.opts.LeaseTTL, r.ob.now)
	var lastFull time.Time
	if err := l.Acquire(ctx, func(holder string) {
		r.log.Info("outbox relay waiting for the lease", "holder", holder)
	}, func(err error) bool {
		err = classifyWriteErr(err)
		freed := r.writeFailed(err)
		if time.Since(lastFull) >= time.Minute {
			lastFull = time.Now()
			r.log.Warn("outbox relay cannot take its lease: disk full; waiting for space", "err", err)
		}
		return freed
	}); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r.metrics.leaseHeld.Store(true)
	r.lease = l
	defer r.metrics.leaseHeld.Store(false)
	if r.hooks.onLease != nil {
		r.hooks.onLease(l)
	}
	r.log.Info("outbox relay started", "envelope", r.opts.Envelope.String(), "window", r.opts.Window)
	defer func() {
		// The context is done by now; releasing needs a fresh one.
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := conn.Do(func(c *sql.Conn) error { return r.ob.storeClock(rctx, c) }); err != nil {
			r.log.Warn("outbox relay could not store the outbox clock", "err", err)
		}
		if err := l.Release(rctx); err != nil {
			r.log.Warn("outbox relay could not release its lease", "err", err)
		}
	}()

	var wg sync.WaitGroup
	defer wg.Wait()
	bg, stopBG := context.WithCancelCause(ctx)
	defer stopBG(nil)
	wg.Add(2)
	go func() {
		defer wg.Done()
		r.keepLease(bg, l, stopBG)
	}()
	go func() {
		defer wg.Done()
		r.purgeLoop(bg, conn)
	}()
	err = r.drain(bg, conn, l)
	if cause := context.Cause(bg); errors.Is(cause, ErrLeaseLost) {
		return cause
	}
	return err
}

// drain connects, runs sessions and reconnects until ctx ends.
func (r *Relay) drain(ctx context.Context, conn *sqlconn.Conn, l *lease.Lease) error {
	bo := r.opts.Reconnect.newBackOff()
	var failures int
	var lastWarn time.Time
	var lastMsg string
	r.metrics.setConnected(false, true, time.Now())
	defer func() { r.metrics.setConnected(false, false, time.Now()) }()
	for ctx.Err() == nil {
		r.metrics.attempts.Add(1)
		if err := r.pub.Connect(ctx); err != nil {
			if ctx.Err() != nil {
				break
			}
			r.setErr(err)
			r.noteOutcome(err)
			failures++
			delay := bo.NextBackOff()
			// A long outage must not flood the log: warn when it starts,
			// when the reason changes, and once a minute.
			level := slog.LevelDebug
			if msg := err.Error(); msg != lastMsg || time.Since(lastWarn) >= time.Minute {
				level, lastMsg, lastWarn = slog.LevelWarn, msg, time.Now()
			}
			r.log.Log(ctx, level, "outbox relay cannot connect", "err", err, "attempts", failures, "retry_in", delay.Round(time.Millisecond))
			if !wait.Sleep(ctx, delay, r.kick) {
				break
			}
			continue
		}
		r.connected.Store(true)
		r.metrics.setConnected(true, true, time.Now())
		r.noteProtocol(ctx, l)
		r.log.Info("outbox relay connected", "after_attempts", failures+1, "protocol", r.Protocol(), "broker", r.broker())
		failures, lastMsg = 0, ""
		start := time.Now()
		res := r.session(ctx, conn, l, scope{})
		progress := res.progress
		for res.keep {
			// The broker refused a message, or said it is unavailable, and
			// kept the connection: no reconnection; the next session
			// starts on it once the message's retry delay, or the wait of
			// an outage, has passed.
			r.setErr(res.err)
			delay, what, refused := res.retryAfter, "the broker refused a message; connection kept", res.refused
			if r.noteOutcome(res.err) {
				if res.progress {
					bo.Reset()
				}
				delay, what, refused = bo.NextBackOff(), "the broker is unavailable; connection kept", -1
			}
			r.log.Warn("outbox relay: "+what, "err", res.err, "retry_in", delay.Round(time.Millisecond))
			if refused >= 0 && refused < MaxPriority {
				// The higher priorities need not wait with the refused
				// message: they go meanwhile, on the same connection.
				sub := r.session(ctx, conn, l, scope{floor: refused + 1, until: time.Now().Add(delay)})
				progress = progress || sub.progress
				if sub.keep || sub.err != nil || sub.fatal != nil || ctx.Err() != nil {
					res = sub
					continue
				}
			} else if !wait.Sleep(ctx, delay, nil) {
				break
			}
			res = r.session(ctx, conn, l, scope{})
			progress = progress || res.progress
		}
		r.pub.Disconnect()
		r.connected.Store(false)
		r.metrics.setConnected(false, true, time.Now())
		if res.fatal != nil {
			return res.fatal
		}
		if ctx.Err() != nil {
			break
		}
		// A connection the broker accepted resets the backoff: the outage
		// waited out is over. Unless it carried nothing and the broker
		// ended it saying it is unavailable: then the wait keeps growing,
		// as for any outage, so that a fleet does not rush a busy broker.
		if !r.noteOutcome(res.err) || progress || time.Since(start) > r.opts.Reconnect.withDefaults().Max {
			bo.Reset()
		}
		if res.err != nil {
			r.setErr(res.err)
		}
		delay := max(bo.NextBackOff(), res.retryAfter)
		r.log.Warn("outbox relay connection lost", "err", res.err, "retry_in", delay.Round(time.Millisecond))
		if !wait.Sleep(ctx, delay, r.kick) {
			break
		}
	}
	r.log.Info("outbox relay stopped")
	return nil
}

// noteProtocol records what the new connection speaks, in Stats and in the
// lease. A failed write costs only the status line.
func (r *Relay) noteProtocol(ctx context.Context, l *lease.Lease) {
	ps, ok := r.pub.(ProtocolNamer)
	if !ok {
		return
	}
	p := ps.Protocol()
	r.mu.Lock()
	changed := p != r.protocol
	r.protocol = p
	r.mu.Unlock()
	if !changed {
		return
	}
	if err := l.SetProtocol(ctx, p); err != nil && ctx.Err() == nil {
		r.log.Warn("outbox relay could not record its protocol version in the lease", "err", err)
	}
}

// broker is the publisher's address, if it says.
func (r *Relay) broker() string {
	if bn, ok := r.pub.(BrokerNamer); ok {
		return bn.Broker()
	}
	return ""
}

// Protocol is what the relay's connection speaks, as it last connected (an
// MQTT version, "5" or "3.1.1", or another protocol's name: ProtocolNamer);
// empty if the publisher does not say.
func (r *Relay) Protocol() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.protocol
}

// relayHooks are what tests may set on a relay before Run, to watch it or
// make it fail where a real fault is hard to arrange. Nil: none.
type relayHooks struct {
	// onLease is given the lease once it is held.
	onLease func(*lease.Lease)
	// beforeHandOff learns of each message just before the relay's last
	// check of its lease and the hand-off (the stalled holder's test).
	beforeHandOff func(seq int64)
	// onWindowBytes learns each time dispatch waits for WindowBytes, with
	// the payload bytes in flight.
	onWindowBytes func(inFlight int64)
	// watch replaces parts of the WAL watch (its safety look, how it
	// subscribes and reads the index).
	watch walwatch.Options
	// onAsk learns of each data_version query made while waiting.
	onAsk func()
	// syncWAL replaces the fsync of the WAL (internal/durable's Syncer).
	syncWAL func() error
	// onSkip learns of each renewal an idle relay skips; onPurge of each
	// purge run.
	onSkip, onPurge func()
}

// call calls hook, if it is set.
func call(hook func()) {
	if hook != nil {
		hook()
	}
}

// syncWAL is how the relay makes the WAL durable: its Syncer, unless a
// test replaced it.
func (r *Relay) syncWAL() func() error {
	if r.hooks.syncWAL != nil {
		return r.hooks.syncWAL
	}
	return r.wal.Sync
}
