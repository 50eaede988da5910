package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/edgeoutbox/outbox/internal/mqtt"
	"github.com/edgeoutbox/outbox/internal/wait"
)

// The MQTT command receiver's machinery (its public face is in mqtt.go):
// internal/mqtt's persistent-session subscriber, as the consumer's
// Subscriber uses it, handing each command to StoreCommand and
// acknowledging it only once stored.

// commandExpireEvery is how often the receiver expires stale commands
// (ExpireCommands): an application in another language, which applies
// commands but does not judge their expiry, gets its "expired" answers
// within it.
const commandExpireEvery = time.Second

// commandPacketRoom is what a command's MQTT packet may hold beside its
// payload, which StoreCommand bounds by the outbox's MaxPayloadBytes: the
// fixed header, the topic, the packet id and MQTT 5's properties (Response
// Topic and Correlation Data, 64 KiB each at most; Content Type; the user
// properties of CloudEvents binary mode, whose id, source and type
// StoreCommand bounds to 1 KiB or less). 512 KiB holds them with room to
// spare; a packet beyond it is refused before it is read (its payload
// could never be stored but as malformed), so what a broker sends cannot
// make the receiver allocate more.
const commandPacketRoom = 512 << 10

// commandReceiver is an MQTTCommandReceiver's state.
type commandReceiver struct {
	ob      *Outbox
	opts    MQTTCommandOptions
	brokers *mqtt.Brokers
	conf    mqtt.SessionOptions
	log     *slog.Logger
	trusted func() bool

	connected   atomic.Bool
	stored      atomic.Int64
	duplicates  atomic.Int64
	storeErrors atomic.Int64
	expired     atomic.Int64

	mu       sync.Mutex
	lastErr  error
	protocol string

	// beforeAck, set by tests, runs after a command was stored and before
	// its PUBACK; returning false drops the acknowledgement and ends the
	// session, as a crash at that moment would.
	beforeAck func(IncomingCommand) bool
	// expireEvery, set by tests, replaces commandExpireEvery.
	expireEvery time.Duration
}

func newCommandReceiver(o *Outbox, opts MQTTCommandOptions) (*commandReceiver, error) {
	if o.readOnly {
		return nil, ErrReadOnly
	}
	urls, err := mqtt.ParseBrokers("commands", opts.Broker, opts.Brokers)
	if err != nil {
		return nil, err
	}
	if opts.ClientID == "" {
		return nil, errors.New("outbox: commands: ClientID is required (a fixed one, for the persistent session)")
	}
	if len(opts.ClientID) > 65535 {
		return nil, errors.New("outbox: commands: client id too long")
	}
	if len(opts.Topics) == 0 {
		return nil, errors.New("outbox: commands: no Topics")
	}
	for _, t := range opts.Topics {
		if err := validateCommandFilter(t); err != nil {
			return nil, err
		}
	}
	switch opts.Protocol {
	case ProtocolAuto, Protocol5, Protocol311:
	default:
		return nil, fmt.Errorf("outbox: commands: unknown Protocol %d", int(opts.Protocol))
	}
	if opts.TLSFiles != nil {
		if _, err := opts.TLSFiles.Config(); err != nil {
			return nil, err
		}
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	if opts.KeepAlive <= 0 {
		opts.KeepAlive = 30 * time.Second
	}
	if opts.PingTimeout <= 0 {
		opts.PingTimeout = 10 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = o.log
	}
	log = log.With("commands", opts.ClientID)
	r := &commandReceiver{ob: o, opts: opts, log: log, trusted: opts.WallClockTrusted,
		brokers: mqtt.NewBrokers(urls, opts.ClientID, log, "outbox commands: ")}
	if r.trusted == nil {
		r.trusted = DefaultWallClockTrusted
	}
	r.conf = mqtt.SessionOptions{
		ClientID: opts.ClientID, Username: opts.Username, Password: opts.Password, Topics: opts.Topics,
		TLSConfig: opts.TLSConfig, TLSFiles: (*mqtt.TLSFiles)(opts.TLSFiles),
		ConnectTimeout: opts.ConnectTimeout, KeepAlive: opts.KeepAlive, PingTimeout: opts.PingTimeout,
		MaxPacketBytes: o.MaxPayloadBytes() + commandPacketRoom, Logger: log,
		Connected: func(protocol string) {
			r.mu.Lock()
			r.protocol = protocol
			r.mu.Unlock()
		},
		Subscribed: func() { r.connected.Store(true) },
	}
	return r, nil
}

// validateCommandFilter checks a command topic filter: valid UTF-8 without
// NUL, at most 65,535 bytes, '#' only as the whole last level, '+' only as
// a whole level, and no shared subscription (it would spread one device's
// commands over several sessions, out of order).
func validateCommandFilter(f string) error {
	bad := func(why string) error { return fmt.Errorf("outbox: commands: topic filter %q: %s", f, why) }
	switch {
	case f == "":
		return bad("empty")
	case len(f) > 65535:
		return bad("longer than 65,535 bytes")
	case !utf8.ValidString(f) || strings.IndexByte(f, 0) >= 0:
		return bad("not valid UTF-8, or holds a NUL")
	case strings.HasPrefix(f, "$share/"):
		return bad("a shared subscription would spread a device's commands over several sessions, out of order")
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		switch {
		case strings.Contains(l, "#") && (l != "#" || i != len(levels)-1):
			return bad("'#' must be the whole last level")
		case strings.Contains(l, "+") && l != "+":
			return bad("'+' must be a whole level")
		}
	}
	return nil
}

func (r *commandReceiver) stats() MQTTCommandStats {
	st := MQTTCommandStats{
		Connected: r.connected.Load(), Stored: r.stored.Load(), Duplicates: r.duplicates.Load(),
		StoreErrors: r.storeErrors.Load(), Expired: r.expired.Load(),
	}
	r.mu.Lock()
	if r.lastErr != nil {
		st.LastError = r.lastErr.Error()
	}
	st.Protocol = r.protocol
	r.mu.Unlock()
	st.Broker = mqtt.Redact(r.brokers.Current())
	return st
}

func (r *commandReceiver) setErr(err error) {
	r.mu.Lock()
	r.lastErr = err
	r.mu.Unlock()
}

// run is MQTTCommandReceiver.Run.
func (r *commandReceiver) run(ctx context.Context) error {
	wait.Reconnect(ctx, wait.Backoff(r.opts.Reconnect), func(ctx context.Context) error {
		defer r.connected.Store(false)
		return r.session(ctx)
	}, r.expireLoop, func(err error, retryIn time.Duration) bool {
		r.setErr(err)
		r.log.Warn("outbox commands disconnected", "err", err, "retry_in", retryIn.Round(time.Millisecond))
		return true
	})
	return nil
}

// expireLoop expires stale commands now and then until ctx ends.
func (r *commandReceiver) expireLoop(ctx context.Context) {
	every := r.expireEvery
	if every <= 0 {
		every = commandExpireEvery
	}
	wait.Every(ctx, every, nil, func() {
		n, err := r.ob.ExpireCommands(ctx, r.trusted)
		r.expired.Add(n)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("outbox commands could not expire stale commands", "err", err)
		}
	})
}

// errStoreFailed ends a session in which a command could not be stored.
type errStoreFailed struct{ err error }

func (e *errStoreFailed) Error() string {
	return "a command could not be stored (not acknowledged: it comes again): " + e.err.Error()
}
func (e *errStoreFailed) Unwrap() error { return e.err }

// session runs one connection to the next address until it is lost, a
// command cannot be stored, or ctx ends.
func (r *commandReceiver) session(ctx context.Context) error {
	return r.brokers.Connect(ctx, mqtt.Version(r.opts.Protocol), func(ctx context.Context, a *mqtt.Attempt) error {
		var failed error
		err := mqtt.Subscribe(ctx, a, &r.conf, func(ctx context.Context, m mqtt.Message) bool {
			ok, err := r.store(ctx, m)
			failed = err
			return ok
		})
		if err == nil {
			err = failed
		}
		return err
	})
}

// store stores one command and acknowledges it. It returns false, leaving
// the command unacknowledged, when ctx ended (nil error) or the store
// failed: the session ends then, and the broker delivers the command again
// on the next one (over MQTT 5 the PUBACKs go in order, so nothing after
// it can be acknowledged on this one anyway).
func (r *commandReceiver) store(ctx context.Context, m mqtt.Message) (bool, error) {
	in := IncomingCommand{
		Topic: m.Topic, Payload: m.Payload, ContentType: m.ContentType, User: userProperties(m.User),
		ResponseTopic: m.ResponseTopic, CorrelationData: m.CorrelationData, MessageExpiry: m.MessageExpiry,
	}
	stored, err := r.ob.StoreCommand(ctx, in, r.trusted)
	if err != nil {
		if ctx.Err() != nil {
			return false, nil
		}
		r.storeErrors.Add(1)
		return false, &errStoreFailed{err}
	}
	if stored {
		r.stored.Add(1)
	} else {
		r.duplicates.Add(1)
	}
	if r.beforeAck != nil && !r.beforeAck(in) {
		return false, errors.New("test: acknowledgement dropped")
	}
	m.Ack()
	return true, nil
}

// userProperties is what the broker sent, as IncomingCommand holds it.
func userProperties(u []mqtt.UserProperty) []UserProperty {
	if len(u) == 0 {
		return nil
	}
	out := make([]UserProperty, len(u))
	for i, p := range u {
		out[i] = UserProperty(p)
	}
	return out
}
