package outbox

import (
	"context"
	"errors"
	"time"
)

// This file is the whole contract between the relay and a transport: what a
// Publisher must do, what it may do besides (each an interface of its own,
// asked for with a type assertion), and how it says whose fault a failure
// was. MQTTPublisher (mqtt.go) is one implementation; package outboxtest
// runs the delivery guarantees against any other.

// Publisher sends messages to a broker. The relay owns the connection's
// life: it calls Connect, with backoff, until it succeeds, publishes, and
// calls Disconnect after any failure before connecting again.
type Publisher interface {
	// Connect opens a new connection, returning when it is up or has failed.
	Connect(ctx context.Context) error
	// Publish starts sending one message and returns without waiting for the
	// acknowledgement. The token completes with nil once the broker has
	// acknowledged this very message, or with an error that says whose
	// fault the failure was (see Token).
	Publish(topic string, payload []byte) Token
	// Disconnect closes the connection. Tokens still in flight must then
	// complete with an error.
	Disconnect()
}

// Token tracks one publish.
//
// Its error says whose fault a failure was, and the relay acts on nothing
// else:
//   - wrapping ErrRejected (a *Refusal is one): the broker refused this
//     message and the connection stays up. The RetryPolicy decides whether
//     it goes again or is parked dead; with ErrUndeliverable too, retrying
//     cannot deliver it, and the default policy parks it at once.
//   - wrapping ErrBrokerUnavailable: the broker said it cannot take
//     messages for now, for a reason of its own (busy, over quota, shutting
//     down), on a connection that may stay up or not. An outage: nothing is
//     charged, nothing becomes the suspect, and the relay backs off.
//   - wrapping ErrNotConnected: it was never sent; nothing is charged.
//   - wrapping ErrStalled: the connection moved no bytes before the
//     message had left; nothing is charged, even to a suspect.
//   - anything else: the connection's fault (lost, refused, a malformed
//     packet). It never counts against the message by
//     itself; see the isolation rule in docs/delivery.md.
type Token interface {
	// Done is closed when the publish completed or failed.
	Done() <-chan struct{}
	// Error is valid once Done is closed.
	Error() error
}

// Refusal is the error of a Token whose message the broker refused for
// itself, on a connection that stays up: it matches ErrRejected, and
// ErrUndeliverable too when Permanent. Its text is what the message's
// last_error holds.
type Refusal struct {
	Reason    string // in words, e.g. "not authorized (0x87)"
	Permanent bool   // retrying cannot deliver it
}

func (e *Refusal) Error() string { return e.Reason }

// Is makes a Refusal match ErrRejected, and ErrUndeliverable when permanent.
func (e *Refusal) Is(target error) bool {
	return target == ErrRejected || (e.Permanent && target == ErrUndeliverable)
}

// undeliverable is the relay's own refusal of a row that no connection can
// carry (a topic written by plain SQL that is not one, a message over the
// transport's size limit): it reads as err and matches ErrRejected and
// ErrUndeliverable.
func undeliverable(err error) error { return &undeliverableError{err} }

type undeliverableError struct{ err error }

func (e *undeliverableError) Error() string { return e.err.Error() }
func (e *undeliverableError) Unwrap() error { return e.err }
func (e *undeliverableError) Is(target error) bool {
	return target == ErrRejected || target == ErrUndeliverable
}

// fault is whose fault a failed publish was: the one reading of a Token's
// error (see Token).
type fault int

const (
	faultConnection    fault = iota // the connection's: charged only by the isolation rule
	faultNotSent                    // never sent: nothing charged
	faultStalled                    // nothing left this host: nothing charged
	faultMessage                    // refused for itself: charged
	faultUndeliverable              // refused for itself, for good
	faultBroker                     // the broker's own state: nothing charged, the relay backs off
)

func faultOf(err error) fault {
	switch {
	case errors.Is(err, ErrBrokerUnavailable):
		return faultBroker
	case errors.Is(err, ErrRejected) && errors.Is(err, ErrUndeliverable):
		return faultUndeliverable
	case errors.Is(err, ErrRejected):
		return faultMessage
	case errors.Is(err, ErrNotConnected):
		return faultNotSent
	case errors.Is(err, ErrStalled):
		return faultStalled
	}
	return faultConnection
}

// PublishProperties are what a message may carry beside its payload, where
// the connection carries them (MQTT 5's PUBLISH properties). The relay sets
// them for CloudEvents binary mode (the attributes as user properties, the
// data's content type as the content type) and for a message with an expiry
// (what is left of it); a publisher whose connection cannot carry them is
// never given any.
type PublishProperties struct {
	// ContentType is the payload's media type (MQTT 5's Content Type).
	ContentType string
	// User holds the user properties, in order; a key may repeat.
	User []UserProperty
	// MessageExpiry is what is left of the message's life (MQTT 5's Message
	// Expiry Interval, sent in whole seconds rounded up); 0 means none.
	MessageExpiry time.Duration
	// CorrelationData is MQTT 5's Correlation Data (at most 65,535 bytes):
	// what the requester gave, so that it can match the answer; nil means
	// none.
	CorrelationData []byte
}

// UserProperty is one user property: a key and a value.
type UserProperty struct {
	Key, Value string
}

// empty reports whether p carries nothing.
func (p *PublishProperties) empty() bool {
	return p == nil || p.ContentType == "" && len(p.User) == 0 && p.MessageExpiry <= 0 && len(p.CorrelationData) == 0
}

// The optional capabilities. A Publisher implements those its transport
// has; the relay asks for each with a type assertion and does without it
// otherwise.

// PropertiesPublisher is a Publisher that can send PublishProperties. The
// relay asks CarriesProperties after each Connect and, while it is true,
// publishes a message that has properties with PublishWithProperties; a
// Publisher without this interface receives Publish only.
//
// A type that embeds *MQTTPublisher gets this interface with it: one that
// overrides Publish to see each message must override PublishWithProperties
// too, or messages with properties (over MQTT 5, every CloudEvents one: its
// Content Type) go around it.
type PropertiesPublisher interface {
	Publisher
	// CarriesProperties reports whether the connection made by the last
	// Connect carries properties (MQTT: it speaks 5).
	CarriesProperties() bool
	// PublishWithProperties is Publish with properties.
	PublishWithProperties(topic string, payload []byte, props PublishProperties) Token
}

// ProgressToken is a Token that can tell how far its message has got on
// the way out, so that a slow link is not taken for a broken one:
// RelayOptions.AckTimeout counts from when the message's last byte left,
// and until then from the last time the connection moved any bytes. Other
// tokens get the plain AckTimeout from the hand-off.
type ProgressToken interface {
	Token
	// Progress reports whether every byte of the message has left this
	// host, and since when; while it has not, the last time the connection
	// moved any bytes. It may ask the kernel, so the relay calls it only
	// for publishes that wait.
	Progress() (left bool, since time.Time)
}

// NoSubscribersToken is a Token that can tell whether the broker, taking
// the message, said that no subscription matched its topic (MQTT 5: PUBACK
// 0x10). The message counts as sent, yet it reached nobody unless a
// persistent session held it: the relay counts these, keeps the last
// topic, and warns (RelayMetrics.NoSubscribers).
type NoSubscribersToken interface {
	Token
	// NoSubscribers is valid once Done is closed with a nil Error.
	NoSubscribers() bool
}

// WindowLimiter is a Publisher whose broker may allow fewer publishes
// awaiting their acknowledgement than RelayOptions.Window (MQTT 5's
// Receive Maximum). The relay asks after each Connect.
type WindowLimiter interface {
	// MaxInFlight is the broker's limit on the current connection; 0 means
	// none.
	MaxInFlight() int
}

// SizeLimiter is a Publisher whose protocol bounds what one message can be.
// The relay asks for every row it reads, with what the message will be on
// the connection (its encoded payload and properties; props nil on one
// that carries none), and parks a message that can never be sent as dead at
// once instead of publishing it. A limit of one connection only (a broker's
// announced maximum) is the Token's to report, as a permanent Refusal.
type SizeLimiter interface {
	// CheckSize returns nil if the message fits, else why it never can.
	CheckSize(topic string, payloadBytes int, props *PublishProperties) error
}

// TopicChecker is a Publisher whose transport refuses topics that every
// transport takes (ValidateTopic: what Enqueue and the schema check), such
// as NATS, whose subjects cannot hold '.' or a space in an MQTT-style
// topic. The relay asks for every row it reads, before encoding it, and
// parks a message whose topic can never be sent as dead at once, with the
// error as its reason, instead of publishing it.
type TopicChecker interface {
	// CheckTopic returns nil if topic can be published, else why it never
	// can.
	CheckTopic(topic string) error
}

// ConnectionWatcher is a Publisher that can tell when its connection drops
// while idle, so that the relay reconnects before the next message is due
// rather than when it fails.
type ConnectionWatcher interface {
	// ConnectionLost returns a channel closed when the connection made by
	// the last Connect is lost; nil while there is none.
	ConnectionLost() <-chan struct{}
}

// LossExplainer is a Publisher that can tell why the broker ended the last
// connection (MQTT 5: a DISCONNECT's reason code), for the log and
// RelayStats.LastError.
type LossExplainer interface {
	// LostReason is why, when the broker said; nil otherwise.
	LostReason() error
}

// ProtocolNamer is a Publisher that can say which protocol its connection
// speaks: the relay logs it, shows it in RelayStats and stores it with the
// lease, for outboxctl status and the status page.
type ProtocolNamer interface {
	// Protocol is what the current connection speaks: an MQTT version
	// ("5", "3.1.1"), or another protocol's name ("NATS JetStream"); ""
	// while not connected.
	Protocol() string
}

// BrokerNamer is a Publisher that can say which address it connected to
// (one node of a cluster), for RelayStats and the status page.
type BrokerNamer interface {
	// Broker is the address of the last Connect, without credentials.
	Broker() string
}
