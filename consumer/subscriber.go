package consumer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeoutbox/outbox"

	"github.com/edgeoutbox/outbox/internal/mqtt"
	"github.com/edgeoutbox/outbox/internal/wait"
)

// SubscriberOptions configures a Subscriber.
type SubscriberOptions struct {
	// Broker is the broker's URL, as for MQTTOptions. Broker or Brokers is
	// required.
	Broker string
	// Brokers are a clustered broker's nodes, as for MQTTOptions: each
	// connection attempt after the first moves to the next address, and
	// the first is chosen by ClientID. Set this or Broker, not both. A
	// persistent session lives on the broker: on a node that lost it, the
	// messages it held for this consumer are gone for it (a cluster that
	// shares sessions among its nodes, as NATS's does, keeps them).
	Brokers []string
	// ClientID is required and must stay the same across restarts: with a
	// persistent session the broker keeps what is published while the
	// consumer is away, under this id.
	ClientID string
	// Topics are the filters subscribed to at QoS 1. Required. A shared
	// subscription, "$share/group/filter", spreads the filter's messages
	// over the group's members (each goes to one of them): consumers that
	// share one Inbox database then apply each event once, between them.
	// That gives up order: two events of one device may go to two members
	// and be applied in either order. To scale out and keep each device's
	// order, partition devices across consumers by topic filter instead
	// (stores/1/# to one, stores/2/# to another).
	Topics []string
	// CleanSession gives the subscriber a session that ends with its
	// connection (3.1.1's clean session; 5's Clean Start with a Session
	// Expiry Interval of 0) instead of the persistent one, so nothing is
	// kept for it while it is away. For members of a shared subscription:
	// with persistent sessions a member that is away keeps its share until
	// it returns; with clean ones the share goes to the members still
	// connected, but what a member whose connection breaks had been given
	// and had not acknowledged is lost, and so is what is published while
	// no member is connected (docs/consumer.md, "Shared subscriptions: a
	// member that goes away"). Connecting once with it also retires a
	// client id: its persistent session, and what that held, is discarded.
	CleanSession bool
	Username     string
	Password     string
	// TLSConfig and TLSFiles as for MQTTOptions.
	TLSConfig *tls.Config
	TLSFiles  *outbox.TLSFiles
	// Envelope is what the producer puts on the wire; CloudEvents unless set
	// (either content mode: binary mode arrives over MQTT 5 only, and
	// EnvelopeCloudEventsBinary means the same here). Batched and
	// compressed messages are read either way (docs/batching.md). With
	// EnvelopeRaw there is no id, so events cannot be deduplicated: the
	// handler gets Event{Source: RawSource, Data: payload} for each payload
	// (one, or each of a raw batch's) and runs in a transaction,
	// unrecorded.
	Envelope  outbox.Envelope
	RawSource string
	// Reconnect is the backoff between connection attempts (never gives up).
	Reconnect outbox.Backoff
	// HandlerBackoff is the wait between attempts of a failing handler.
	// The event is tried again until it succeeds or the subscriber stops;
	// events behind it wait, so the order holds. Defaults: 1 s initial,
	// 1 min cap.
	HandlerBackoff outbox.Backoff
	// Protocol is the MQTT version, as for MQTTOptions: ProtocolAuto (the
	// default) speaks 5 and falls back to 3.1.1 for a broker without 5.
	// Both keep a persistent session (3.1.1's clean session false; 5's
	// Clean Start false with a session that never expires), unless
	// CleanSession, and acknowledge a message only after its transaction
	// committed.
	Protocol outbox.MQTTProtocol
	// ConnectTimeout (10 s), KeepAlive (30 s) and PingTimeout (10 s) as for
	// MQTTOptions.
	ConnectTimeout time.Duration
	KeepAlive      time.Duration
	PingTimeout    time.Duration
	// MaxPacketBytes bounds each packet from the broker, its MQTT header
	// included: a larger one is never allocated. 0 means 17 MiB, which
	// holds the largest batch a relay makes (outbox.MaxBatchBytesLimit)
	// and a single event of up to about 12 MiB. It must cover the largest
	// message the relays publish, batches included (their
	// BatchOptions.MaxBytes) and any event alone (its payload limit, ×4/3
	// in structured mode's base64): over MQTT 5 it is announced as the
	// Maximum Packet Size and the broker drops a larger message for this
	// subscriber; over 3.1.1 the connection ends at one, and the message
	// comes again each time.
	MaxPacketBytes int
	Logger         *slog.Logger
	// OnEvent, if set, is called for each event of a message, in order,
	// once every event of it is settled and the message acknowledged:
	// applied (committed), a duplicate, or quarantined (err says why; a
	// message that could not be decoded at all is one call, with a zero
	// Event). It runs on the subscriber's one worker; keep it quick.
	OnEvent func(ev outbox.Event, outcome Outcome, err error)

	// beforeAck, set by tests, runs after the transactions of a message
	// committed and before the PUBACK, with its last event; returning false
	// drops the acknowledgement, as a crash at that moment would (over MQTT 5, whose PUBACKs go in order,
	// the ones behind it are then held back too: the test stops the
	// subscriber, as the crash would).
	beforeAck func(outbox.Event) bool
}

// Subscriber receives events from an MQTT broker and applies each through
// an Inbox, in a transaction of its own, acknowledging a message (PUBACK)
// only after the transactions of all its events committed (a batch holds
// many): a crash in between leads to a redelivery, which the inbox
// recognises, never to a loss. A message that cannot be decoded is
// quarantined, acknowledged and counted, never allowed to block the rest;
// so is an event of a batch that cannot be applied, alone.
type Subscriber struct {
	in      *Inbox
	h       Handler
	opts    SubscriberOptions
	brokers *mqtt.Brokers // the addresses, the next to try, what auto learnt
	conf    mqtt.SessionOptions
	log     *slog.Logger

	connected   atomic.Bool
	applied     atomic.Int64
	duplicates  atomic.Int64
	quarantined atomic.Int64
	failures    atomic.Int64

	mu       sync.Mutex
	lastErr  error
	protocol string // what the last connection spoke
}

// Outcome is what became of an event.
type Outcome int

// The outcomes of an event.
const (
	Applied     Outcome = iota + 1 // the handler's transaction committed
	Duplicate                      // applied before; skipped
	Quarantined                    // not a valid event (or message); stored in inbox_quarantine
)

// String returns "applied", "duplicate" or "quarantined".
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Quarantined:
		return "quarantined"
	}
	return "unknown"
}

// SubscriberStats counts what a Subscriber did since it was created.
type SubscriberStats struct {
	Connected     bool
	Applied       int64 // events whose handler committed
	Duplicates    int64 // redeliveries skipped by the inbox
	Quarantined   int64 // messages that could not be decoded, and events refused as invalid
	HandlerErrors int64 // failed attempts (each retried)
	LastError     string
	// Protocol is the MQTT version the last connection spoke ("5" or
	// "3.1.1"); empty before the first.
	Protocol string
	// Broker is the address of the current connection, or of the one
	// being tried (SubscriberOptions.Brokers: a cluster's node), without
	// credentials.
	Broker string
}

// NewSubscriber returns a subscriber that applies events with h through in.
func NewSubscriber(in *Inbox, h Handler, opts SubscriberOptions) (*Subscriber, error) {
	if in == nil || h == nil {
		return nil, errors.New("outbox: subscriber: nil Inbox or Handler")
	}
	urls, err := mqtt.ParseBrokers("subscriber", opts.Broker, opts.Brokers)
	if err != nil {
		return nil, err
	}
	if opts.ClientID == "" {
		return nil, errors.New("outbox: subscriber: ClientID is required (a fixed one, for the persistent session)")
	}
	if len(opts.Topics) == 0 {
		return nil, errors.New("outbox: subscriber: no Topics")
	}
	for _, t := range opts.Topics {
		if err := mqtt.ValidateSubscription(t); err != nil {
			return nil, err
		}
	}
	switch opts.Protocol {
	case outbox.ProtocolAuto, outbox.Protocol5, outbox.Protocol311:
	default:
		return nil, fmt.Errorf("outbox: subscriber: unknown Protocol %d", int(opts.Protocol))
	}
	if opts.HandlerBackoff == (outbox.Backoff{}) {
		opts.HandlerBackoff = outbox.Backoff{Initial: time.Second, Max: time.Minute}
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
	if opts.MaxPacketBytes < 0 {
		return nil, fmt.Errorf("outbox: subscriber: MaxPacketBytes %d is negative", opts.MaxPacketBytes)
	}
	log := opts.Logger
	if log == nil {
		log = in.log
	}
	log = log.With("subscriber", opts.ClientID)
	s := &Subscriber{in: in, h: h, opts: opts, log: log, brokers: mqtt.NewBrokers(urls, opts.ClientID, log, "outbox subscriber: ")}
	s.conf = mqtt.SessionOptions{
		ClientID: opts.ClientID, Username: opts.Username, Password: opts.Password, Topics: opts.Topics,
		CleanSession: opts.CleanSession, TLSConfig: opts.TLSConfig, TLSFiles: (*mqtt.TLSFiles)(opts.TLSFiles),
		ConnectTimeout: opts.ConnectTimeout, KeepAlive: opts.KeepAlive, PingTimeout: opts.PingTimeout,
		MaxPacketBytes: opts.MaxPacketBytes, Logger: log,
		Connected: func(protocol string) {
			s.mu.Lock()
			s.protocol = protocol
			s.mu.Unlock()
		},
		Subscribed: func() { s.connected.Store(true) },
	}
	return s, nil
}

// Stats returns the subscriber's counters.
func (s *Subscriber) Stats() SubscriberStats {
	st := SubscriberStats{
		Connected: s.connected.Load(), Applied: s.applied.Load(), Duplicates: s.duplicates.Load(),
		Quarantined: s.quarantined.Load(), HandlerErrors: s.failures.Load(),
	}
	s.mu.Lock()
	if s.lastErr != nil {
		st.LastError = s.lastErr.Error()
	}
	st.Protocol = s.protocol
	s.mu.Unlock()
	st.Broker = mqtt.Redact(s.brokers.Current())
	return st
}

func (s *Subscriber) setErr(err error) {
	s.mu.Lock()
	s.lastErr = err
	s.mu.Unlock()
}

// Run connects, subscribes and applies events until ctx ends; it reconnects
// with backoff for as long as it takes and forgets expired inbox entries
// along the way. It returns nil when ctx ends.
func (s *Subscriber) Run(ctx context.Context) error {
	wait.Reconnect(ctx, wait.Backoff(s.opts.Reconnect), func(ctx context.Context) error {
		defer s.connected.Store(false)
		return s.session(ctx)
	}, func(ctx context.Context) { s.in.purgeLoop(ctx, s.log) }, func(err error, retryIn time.Duration) bool {
		s.setErr(err)
		s.log.Warn("outbox subscriber disconnected", "err", err, "retry_in", retryIn.Round(time.Millisecond))
		return true
	})
	return nil
}

// session runs one connection to the next address until it is lost or ctx
// ends, in the version Protocol asks for (auto: see ProtocolAuto).
func (s *Subscriber) session(ctx context.Context) error {
	return s.brokers.Connect(ctx, mqtt.Version(s.opts.Protocol), func(ctx context.Context, a *mqtt.Attempt) error {
		return mqtt.Subscribe(ctx, a, &s.conf, s.process)
	})
}

// process applies the events of one message, each in its own Inbox
// transaction and in the message's order, and acknowledges the message once
// every one is settled; false means ctx ended first (the message stays
// unacknowledged and comes again, and the Inbox skips what was applied).
func (s *Subscriber) process(ctx context.Context, m mqtt.Message) bool {
	parts, err := s.decode(m)
	if err != nil {
		return s.quarantine(ctx, m, outbox.Event{}, err)
	}
	outcomes := make([]Outcome, len(parts))
	causes := make([]error, len(parts))
	for i, p := range parts {
		outcome, cause, ok := s.apply(ctx, p.Event)
		if !ok {
			return false
		}
		if outcome == Quarantined {
			if len(parts) == 1 {
				return s.quarantine(ctx, m, p.Event, cause)
			}
			// One event of a batch: kept alone, the rest go on.
			if !s.keep(ctx, m.Topic, p.Bytes, fmt.Errorf("event %d of %d: %w", i+1, len(parts), cause)) {
				return false
			}
		}
		outcomes[i], causes[i] = outcome, cause
	}
	if s.opts.beforeAck != nil && !s.opts.beforeAck(parts[len(parts)-1].Event) {
		return true
	}
	m.Ack()
	if s.opts.OnEvent != nil {
		for i := range parts {
			s.opts.OnEvent(parts[i].Event, outcomes[i], causes[i])
		}
	}
	return true
}

// decode returns the events of m (docs/batching.md): with EnvelopeRaw its
// payloads, each an event without an id.
func (s *Subscriber) decode(m mqtt.Message) ([]outbox.EventPart, error) {
	user := userProperties(m.User)
	if s.opts.Envelope != outbox.EnvelopeRaw {
		return outbox.DecodeEventPartsMQTT(m.Payload, m.ContentType, user)
	}
	payloads, err := outbox.DecodeRawMQTT(m.Payload, m.ContentType, user)
	if err != nil {
		return nil, err
	}
	parts := make([]outbox.EventPart, len(payloads))
	for i, p := range payloads {
		parts[i] = outbox.EventPart{Event: outbox.Event{Source: s.opts.RawSource, Data: p}, Bytes: p}
	}
	return parts, nil
}

// apply applies ev through the Inbox, trying a failing handler again with
// HandlerBackoff until it succeeds: Applied or Duplicate, or Quarantined
// with the reason when retrying cannot help; ok is false when ctx ended
// first.
func (s *Subscriber) apply(ctx context.Context, ev outbox.Event) (outcome Outcome, cause error, ok bool) {
	outcome, cause, ok = s.in.applyRetrying(ctx, s.opts.HandlerBackoff, ev, s.h, func(err error, retryIn time.Duration) {
		s.failures.Add(1)
		s.setErr(err)
		s.log.Warn("outbox subscriber handler failed", "id", ev.ID, "source", ev.Source, "err", err, "retry_in", retryIn.Round(time.Millisecond))
	}, nil)
	countApplied(outcome, ok, &s.applied, &s.duplicates)
	return outcome, cause, ok
}

// quarantine keeps a whole message that is not a valid event and
// acknowledges it.
func (s *Subscriber) quarantine(ctx context.Context, m mqtt.Message, ev outbox.Event, cause error) bool {
	if !s.keep(ctx, m.Topic, m.Payload, cause) {
		return false
	}
	m.Ack()
	if s.opts.OnEvent != nil {
		s.opts.OnEvent(ev, Quarantined, cause)
	}
	return true
}

// keep stores payload in the Inbox's quarantine, trying again until it is
// stored; false means ctx ended first.
func (s *Subscriber) keep(ctx context.Context, topic string, payload []byte, cause error) bool {
	if !s.in.quarantineRetrying(ctx, s.opts.HandlerBackoff, topic, payload, cause, s.setErr) {
		return false
	}
	s.quarantined.Add(1)
	s.log.Warn("outbox subscriber quarantined a message", "topic", topic, "reason", cause)
	return true
}

// userProperties is what the broker sent, as DecodeEventMQTT reads it.
func userProperties(u []mqtt.UserProperty) []outbox.UserProperty {
	if len(u) == 0 {
		return nil
	}
	out := make([]outbox.UserProperty, len(u))
	for i, p := range u {
		out[i] = outbox.UserProperty{Key: p.Key, Value: p.Value}
	}
	return out
}
