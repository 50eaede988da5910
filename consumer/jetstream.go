package consumer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeoutbox/outbox"

	"github.com/edgeoutbox/outbox/internal/wait"
)

// JetStreamConsumerOptions configures a JetStreamConsumer.
type JetStreamConsumerOptions struct {
	// Servers are the NATS URLs (nats://host:4222, tls://host:4222) of one
	// server or of a cluster's nodes. Required.
	Servers []string
	// User and Password, Token, CredsFile (a user JWT and NKey seed, as
	// nsc writes it) and NKeyFile (an NKey seed alone) are the ways a NATS
	// server authenticates a client; set the one the server asks for.
	User      string
	Password  string
	Token     string
	CredsFile string
	NKeyFile  string
	// TLSConfig and TLSFiles as for SubscriberOptions; either makes the
	// connection TLS.
	TLSConfig *tls.Config
	TLSFiles  *outbox.TLSFiles
	// Stream is the stream the events are in. Required; it is the
	// operator's, never created here.
	Stream string
	// Durable is the name of the durable pull consumer the members share.
	// Required. Each connection binds to it when it exists, as it is (its
	// settings are then the operator's: AckWait and MaxAckPending are not
	// applied, FilterSubject is checked), and creates it with these
	// settings when it does not.
	Durable string
	// FilterSubject, when set, limits the consumer to the stream's
	// subjects that match it (on creation), and a member refuses to bind
	// to an existing Durable that filters otherwise. It keeps a device's
	// order across members: one Durable per partition of the subjects
	// (pos.store1.>, pos.store2.>), each with one member at a time.
	FilterSubject string
	// AckWait is how long a message given to a member waits for its
	// acknowledgement before the consumer gives it to a member again (on
	// creation). A member that dies leaves what it held to the others
	// after this. Default 30 s.
	AckWait time.Duration
	// MaxAckPending bounds the messages given to the members and not yet
	// acknowledged (on creation). 0 means the server's default.
	MaxAckPending int
	// Batch is the most messages one pull asks for. Default 32. A member
	// that dies holds up to this many until AckWait passes.
	Batch int
	// Envelope and RawSource as for SubscriberOptions. Binary mode's
	// attributes are the ce-<attribute> headers of the CloudEvents NATS
	// binding, percent-encoded; datacontenttype is ce-datacontenttype,
	// else the Content-Type header.
	Envelope  outbox.Envelope
	RawSource string
	// Reconnect is the backoff between connection attempts (never gives up).
	Reconnect outbox.Backoff
	// HandlerBackoff is the wait between attempts of a failing handler, as
	// for SubscriberOptions: the message is held (kept in progress, so it
	// is not given to another member) and tried again until it succeeds or
	// the consumer stops; the messages behind it wait, so this member's
	// order holds.
	HandlerBackoff outbox.Backoff
	Logger         *slog.Logger
	// OnEvent as for SubscriberOptions, called after the message was
	// acknowledged.
	OnEvent func(ev outbox.Event, outcome Outcome, err error)

	// pullWait, set by tests, is how long one pull waits for messages.
	pullWait time.Duration
	// crashBefore, set by tests, runs after the transactions of a message
	// committed and before its acknowledgement; returning true makes the
	// member stop at once with nothing more said to the server (no
	// acknowledgement, nothing handed back), as a crash would.
	crashBefore func(outbox.Event) bool
}

// JetStreamConsumer receives events from a NATS JetStream durable pull
// consumer and applies each through an Inbox, in a transaction of its own,
// acknowledging a message only after the transactions of all its events
// committed: a crash in between leads to a redelivery, which the inbox
// recognises. Any number of members (JetStreamConsumers, in any processes)
// may share one durable consumer and one Inbox database: each message goes
// to one member at a time, and what a member held unacknowledged when it
// died goes to the others after AckWait. Order across members is not kept;
// each member applies what it is given in order, but a message in flight
// when a connection broke comes again only after AckWait, behind later
// ones (the Inbox still applies it once). A message that cannot be
// decoded is quarantined and acknowledged, never allowed to block the rest.
type JetStreamConsumer struct {
	in   *Inbox
	h    Handler
	opts JetStreamConsumerOptions
	log  *slog.Logger

	connected   atomic.Bool
	applied     atomic.Int64
	duplicates  atomic.Int64
	quarantined atomic.Int64
	failures    atomic.Int64

	mu      sync.Mutex
	lastErr error
	server  string
}

// JetStreamConsumerStats counts what a JetStreamConsumer did since it was
// created.
type JetStreamConsumerStats struct {
	Connected     bool  // connected and bound to the durable consumer
	Applied       int64 // events whose handler committed
	Duplicates    int64 // redeliveries skipped by the inbox
	Quarantined   int64 // messages that could not be decoded, and events refused as invalid
	HandlerErrors int64 // failed attempts (each retried)
	LastError     string
	// Server is the URL of the current connection, without credentials.
	Server string
}

// errCrashed ends a member's session when a test simulates a crash.
var errCrashed = errors.New("crashed (test)")

// NewJetStreamConsumer returns a consumer that applies events with h
// through in.
func NewJetStreamConsumer(in *Inbox, h Handler, opts JetStreamConsumerOptions) (*JetStreamConsumer, error) {
	if in == nil || h == nil {
		return nil, errors.New("outbox: jetstream consumer: nil Inbox or Handler")
	}
	if len(opts.Servers) == 0 {
		return nil, errors.New("outbox: jetstream consumer: no Servers")
	}
	for _, s := range opts.Servers {
		if strings.Contains(s, ",") {
			return nil, fmt.Errorf("outbox: jetstream consumer: server %q: one URL per entry", redactURL(s))
		}
	}
	if opts.Stream == "" || opts.Durable == "" {
		return nil, errors.New("outbox: jetstream consumer: Stream and Durable are required")
	}
	// NATS refuses these in a stream's or consumer's name; said here once
	// rather than at every connection.
	if strings.ContainsAny(opts.Stream+opts.Durable, ".*> \t\r\n/\\") {
		return nil, fmt.Errorf("outbox: jetstream consumer: Stream %q or Durable %q has a character NATS does not allow in a name", opts.Stream, opts.Durable)
	}
	if opts.AckWait < 0 || opts.MaxAckPending < 0 || opts.Batch < 0 {
		return nil, errors.New("outbox: jetstream consumer: negative AckWait, MaxAckPending or Batch")
	}
	if opts.TLSConfig != nil && opts.TLSFiles != nil {
		return nil, errors.New("outbox: jetstream consumer: set TLSConfig or TLSFiles, not both")
	}
	if opts.AckWait == 0 {
		opts.AckWait = 30 * time.Second
	}
	if opts.Batch == 0 {
		opts.Batch = 32
	}
	if opts.pullWait == 0 {
		opts.pullWait = 5 * time.Second
	}
	if opts.HandlerBackoff == (outbox.Backoff{}) {
		opts.HandlerBackoff = outbox.Backoff{Initial: time.Second, Max: time.Minute}
	}
	log := opts.Logger
	if log == nil {
		log = in.log
	}
	log = log.With("jetstream_consumer", opts.Durable)
	return &JetStreamConsumer{in: in, h: h, opts: opts, log: log}, nil
}

// Stats returns the consumer's counters.
func (c *JetStreamConsumer) Stats() JetStreamConsumerStats {
	st := JetStreamConsumerStats{
		Connected: c.connected.Load(), Applied: c.applied.Load(), Duplicates: c.duplicates.Load(),
		Quarantined: c.quarantined.Load(), HandlerErrors: c.failures.Load(),
	}
	c.mu.Lock()
	if c.lastErr != nil {
		st.LastError = c.lastErr.Error()
	}
	st.Server = c.server
	c.mu.Unlock()
	return st
}

func (c *JetStreamConsumer) setErr(err error) {
	c.mu.Lock()
	c.lastErr = err
	c.mu.Unlock()
}

// Run connects, binds to the durable consumer and applies events until ctx
// ends; it reconnects with backoff for as long as it takes and forgets
// expired inbox entries along the way. It returns nil when ctx ends.
func (c *JetStreamConsumer) Run(ctx context.Context) error {
	wait.Reconnect(ctx, wait.Backoff(c.opts.Reconnect), func(ctx context.Context) error {
		defer c.connected.Store(false)
		return c.session(ctx)
	}, func(ctx context.Context) { c.in.purgeLoop(ctx, c.log) }, func(err error, retryIn time.Duration) bool {
		if errors.Is(err, errCrashed) {
			return false
		}
		c.setErr(err)
		c.log.Warn("outbox jetstream consumer disconnected", "err", err, "retry_in", retryIn.Round(time.Millisecond))
		return true
	})
	return nil
}

// connectOptions are the connection's settings. nats.go's own reconnection
// is off: Run reconnects, with backoff, and binds again.
func (c *JetStreamConsumer) connectOptions() ([]nats.Option, error) {
	o := []nats.Option{nats.Name("outbox consumer " + c.opts.Durable), nats.NoReconnect(), nats.Timeout(10 * time.Second)}
	if c.opts.User != "" || c.opts.Password != "" {
		o = append(o, nats.UserInfo(c.opts.User, c.opts.Password))
	}
	if c.opts.Token != "" {
		o = append(o, nats.Token(c.opts.Token))
	}
	if c.opts.CredsFile != "" {
		o = append(o, nats.UserCredentials(c.opts.CredsFile))
	}
	if c.opts.NKeyFile != "" {
		nk, err := nats.NkeyOptionFromSeed(c.opts.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("outbox: jetstream consumer: NKeyFile: %w", err)
		}
		o = append(o, nk)
	}
	switch {
	case c.opts.TLSConfig != nil:
		o = append(o, nats.Secure(c.opts.TLSConfig.Clone()))
	case c.opts.TLSFiles != nil:
		conf, err := c.opts.TLSFiles.Config()
		if err != nil {
			return nil, fmt.Errorf("outbox: jetstream consumer: %w", err)
		}
		o = append(o, nats.Secure(conf))
	}
	return o, nil
}

// session runs one connection until it is lost or ctx ends.
func (c *JetStreamConsumer) session(ctx context.Context) error {
	o, err := c.connectOptions()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(strings.Join(c.opts.Servers, ","), o...)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	crashed := false
	defer func() {
		if !crashed {
			// The acknowledgements sent last are in the write buffer.
			_ = nc.FlushTimeout(time.Second)
		}
		nc.Close()
	}()
	c.mu.Lock()
	c.server = nc.ConnectedUrlRedacted()
	c.mu.Unlock()
	cons, err := c.bind(ctx, nc)
	if err != nil {
		return err
	}
	c.connected.Store(true)
	c.log.Info("outbox jetstream consumer bound", "server", nc.ConnectedUrlRedacted(), "stream", c.opts.Stream)
	for ctx.Err() == nil {
		err := c.pull(ctx, cons)
		if errors.Is(err, errCrashed) {
			crashed = true
			return err
		}
		if err != nil {
			return err
		}
		if !nc.IsConnected() {
			return fmt.Errorf("connection lost: %w", nats.ErrConnectionClosed)
		}
	}
	return nil
}

// bind returns the durable consumer, creating it when it does not exist.
func (c *JetStreamConsumer) bind(ctx context.Context, nc *nats.Conn) (jetstream.Consumer, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, c.opts.Stream, c.opts.Durable)
	if err == nil {
		return c.checkFilter(cons)
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("consumer %s on stream %s: %w", c.opts.Durable, c.opts.Stream, err)
	}
	cons, err = js.CreateConsumer(ctx, c.opts.Stream, jetstream.ConsumerConfig{
		Durable: c.opts.Durable, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait: c.opts.AckWait, MaxAckPending: c.opts.MaxAckPending, FilterSubject: c.opts.FilterSubject,
	})
	if err != nil {
		// Another member may have created it at the same moment.
		if cons, err2 := js.Consumer(ctx, c.opts.Stream, c.opts.Durable); err2 == nil {
			return c.checkFilter(cons)
		}
		return nil, fmt.Errorf("create consumer %s on stream %s: %w", c.opts.Durable, c.opts.Stream, err)
	}
	c.log.Info("outbox jetstream consumer created the durable consumer", "stream", c.opts.Stream, "ack_wait", c.opts.AckWait)
	return cons, nil
}

// checkFilter refuses an existing durable consumer whose filter is not
// FilterSubject, when one is set: a member meant for one partition of the
// subjects would otherwise take another's events, silently.
func (c *JetStreamConsumer) checkFilter(cons jetstream.Consumer) (jetstream.Consumer, error) {
	if c.opts.FilterSubject == "" {
		return cons, nil
	}
	if got := cons.CachedInfo().Config.FilterSubject; got != c.opts.FilterSubject {
		return nil, fmt.Errorf("consumer %s on stream %s filters %q, not FilterSubject %q: give each partition a Durable of its own", c.opts.Durable, c.opts.Stream, got, c.opts.FilterSubject)
	}
	return cons, nil
}

// pull asks for a batch and applies its messages as they arrive, in order.
// When ctx ends, what arrived and was not applied is handed back (NAK) for
// the other members to take at once.
func (c *JetStreamConsumer) pull(ctx context.Context, cons jetstream.Consumer) error {
	fctx, cancel := context.WithTimeout(ctx, c.opts.pullWait)
	defer cancel()
	batch, err := cons.Fetch(c.opts.Batch, jetstream.FetchContext(fctx))
	if err != nil {
		return fmt.Errorf("pull: %w", err)
	}
	for m := range batch.Messages() {
		if ctx.Err() != nil {
			_ = m.Nak()
			continue
		}
		if err := c.process(ctx, m); err != nil {
			if errors.Is(err, errCrashed) {
				return err
			}
			_ = m.Nak()
		}
	}
	err = batch.Error()
	if err == nil || ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		return nil
	}
	return fmt.Errorf("pull: %w", err)
}

// process applies the events of one message, each in its own Inbox
// transaction, in order, and acknowledges the message once every one is
// settled. An error means ctx ended first (or a test's crash): the message
// is not acknowledged, and the Inbox skips what was applied when it comes
// again.
func (c *JetStreamConsumer) process(ctx context.Context, m jetstream.Msg) error {
	parts, err := c.decode(m)
	if err != nil {
		return c.quarantine(ctx, m, outbox.Event{}, err)
	}
	outcomes := make([]Outcome, len(parts))
	causes := make([]error, len(parts))
	for i, p := range parts {
		outcome, cause, ok := c.apply(ctx, m, p.Event)
		if !ok {
			return ctx.Err()
		}
		if outcome == Quarantined {
			if len(parts) == 1 {
				return c.quarantine(ctx, m, p.Event, cause)
			}
			// One event of a batch: kept alone, the rest go on.
			if !c.keep(ctx, m.Subject(), p.Bytes, fmt.Errorf("event %d of %d: %w", i+1, len(parts), cause)) {
				return ctx.Err()
			}
		}
		outcomes[i], causes[i] = outcome, cause
	}
	if c.opts.crashBefore != nil && c.opts.crashBefore(parts[len(parts)-1].Event) {
		return errCrashed
	}
	// A lost acknowledgement makes the message come again, to this member
	// or another, and the Inbox recognises it: waiting for the server to
	// confirm each one (DoubleAck) would cost a round trip per message.
	if err := m.Ack(); err != nil {
		c.log.Warn("outbox jetstream consumer ack failed", "subject", m.Subject(), "err", err)
	}
	if c.opts.OnEvent != nil {
		for i := range parts {
			c.opts.OnEvent(parts[i].Event, outcomes[i], causes[i])
		}
	}
	return nil
}

// decode returns the events of m, as the Subscriber's decode does for an
// MQTT message, the NATS headers standing for its properties.
func (c *JetStreamConsumer) decode(m jetstream.Msg) ([]outbox.EventPart, error) {
	contentType, user, err := natsProperties(m.Headers())
	if err != nil {
		return nil, fmt.Errorf("outbox: decode event: %w", err)
	}
	if c.opts.Envelope != outbox.EnvelopeRaw {
		return outbox.DecodeEventPartsMQTT(m.Data(), contentType, user)
	}
	payloads, err := outbox.DecodeRawMQTT(m.Data(), contentType, user)
	if err != nil {
		return nil, err
	}
	parts := make([]outbox.EventPart, len(payloads))
	for i, p := range payloads {
		parts[i] = outbox.EventPart{Event: outbox.Event{Source: c.opts.RawSource, Data: p}, Bytes: p}
	}
	return parts, nil
}

// natsProperties maps a message's NATS headers to what the MQTT decoders
// read: each ce-<attribute> header (the CloudEvents NATS binding's binary
// mode, its value percent-encoded) is the user property <attribute>,
// Content-Encoding is content-encoding, and the content type is
// ce-datacontenttype, else Content-Type. Header names are matched without
// regard to case; other headers (Nats-Msg-Id, ...) are ignored.
func natsProperties(h nats.Header) (contentType string, user []outbox.UserProperty, err error) {
	var ceType, plainType []string
	for k, vs := range h {
		lk := strings.ToLower(k)
		switch {
		case lk == "content-type":
			plainType = append(plainType, vs...)
		case lk == "content-encoding":
			for _, v := range vs {
				user = append(user, outbox.UserProperty{Key: "content-encoding", Value: v})
			}
		case lk == "ce-datacontenttype":
			ceType = append(ceType, vs...)
		case strings.HasPrefix(lk, "ce-"):
			for _, v := range vs {
				d, err := url.PathUnescape(v)
				if err != nil {
					return "", nil, fmt.Errorf("header %s: %w", k, err)
				}
				user = append(user, outbox.UserProperty{Key: lk[len("ce-"):], Value: d})
			}
		}
	}
	types := plainType
	if len(ceType) > 0 {
		types = ceType
	}
	switch len(types) {
	case 0:
	case 1:
		contentType, err = url.PathUnescape(types[0])
		if err != nil {
			return "", nil, fmt.Errorf("content type: %w", err)
		}
	default:
		return "", nil, errors.New("content type given twice")
	}
	return contentType, user, nil
}

// apply applies ev through the Inbox, trying a failing handler again with
// HandlerBackoff until it succeeds, and keeps m in progress meanwhile so
// that the consumer does not give it to another member; ok is false when
// ctx ended first.
func (c *JetStreamConsumer) apply(ctx context.Context, m jetstream.Msg, ev outbox.Event) (outcome Outcome, cause error, ok bool) {
	touched := time.Now()
	outcome, cause, ok = c.in.applyRetrying(ctx, c.opts.HandlerBackoff, ev, c.h, func(err error, retryIn time.Duration) {
		c.failures.Add(1)
		c.setErr(err)
		c.log.Warn("outbox jetstream consumer handler failed", "id", ev.ID, "source", ev.Source, "err", err, "retry_in", retryIn.Round(time.Millisecond))
	}, func() {
		if time.Since(touched) > c.opts.AckWait/3 {
			_ = m.InProgress()
			touched = time.Now()
		}
	})
	countApplied(outcome, ok, &c.applied, &c.duplicates)
	return outcome, cause, ok
}

// quarantine keeps a whole message that is not a valid event and
// acknowledges it.
func (c *JetStreamConsumer) quarantine(ctx context.Context, m jetstream.Msg, ev outbox.Event, cause error) error {
	if !c.keep(ctx, m.Subject(), m.Data(), cause) {
		return ctx.Err()
	}
	if err := m.Ack(); err != nil {
		c.log.Warn("outbox jetstream consumer ack failed", "subject", m.Subject(), "err", err)
	}
	if c.opts.OnEvent != nil {
		c.opts.OnEvent(ev, Quarantined, cause)
	}
	return nil
}

// keep stores payload in the Inbox's quarantine, trying again until it is
// stored; false means ctx ended first.
func (c *JetStreamConsumer) keep(ctx context.Context, subject string, payload []byte, cause error) bool {
	if !c.in.quarantineRetrying(ctx, c.opts.HandlerBackoff, subject, payload, cause, c.setErr) {
		return false
	}
	c.quarantined.Add(1)
	c.log.Warn("outbox jetstream consumer quarantined a message", "subject", subject, "reason", cause)
	return true
}

// redactURL is u without its credentials, for messages.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}
