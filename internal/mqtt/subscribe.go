package mqtt

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// SessionOptions configure a subscriber's sessions (Subscribe).
type SessionOptions struct {
	// ClientID names the persistent session on the broker; Username and
	// Password authenticate.
	ClientID string
	Username string
	Password string
	// Topics are the filters subscribed to, at QoS 1.
	Topics []string
	// CleanSession asks for a session that ends with its connection
	// (3.1.1's clean session true; 5's Clean Start true, Session Expiry
	// Interval 0) instead of the persistent one.
	CleanSession bool
	// TLSConfig is used for a TLS URL; TLSFiles, if set, replaces it and
	// is read again for every session.
	TLSConfig *tls.Config
	TLSFiles  *TLSFiles
	// ConnectTimeout bounds connecting, the CONNACK included; KeepAlive is
	// the MQTT keepalive and PingTimeout how long the broker may stay
	// silent after a PINGREQ.
	ConnectTimeout time.Duration
	KeepAlive      time.Duration
	PingTimeout    time.Duration
	// MaxPacketBytes is the largest packet the session takes from the
	// broker, its fixed header included; 0 means DefaultMaxPacketBytes.
	// Over MQTT 5 it is the CONNECT's Maximum Packet Size: the broker
	// must not send this client a larger packet, and discards such a
	// message for it as if delivered [MQTT-3.1.2-24, -25], so it never
	// reaches this subscriber. Over either version a packet whose
	// Remaining Length says it is larger ends the connection with a
	// ProtocolError before its body is read or allocated; over 3.1.1,
	// where the broker cannot be told, a queued message that large comes
	// again on every connection, so the limit must cover every message
	// the subscriber is meant to get.
	MaxPacketBytes int
	// Logger gets the session's notes.
	Logger *slog.Logger
	// Connected, if set, is called once the broker accepted the
	// connection, with the version it speaks: "5" or "3.1.1".
	Connected func(protocol string)
	// Subscribed, if set, is called once the broker acknowledged the
	// subscriptions.
	Subscribed func()
}

// DefaultMaxPacketBytes is SessionOptions.MaxPacketBytes unless set:
// 17 MiB, the largest batch a relay publishes (16 MiB, the outbox's
// MaxBatchBytesLimit, before compression) with 1 MiB for its topic and
// properties. A single event goes alone only up to the relay's payload
// limit, 256 KiB by default (about 342 KiB in base64), far below it. It
// bounds what one packet can make paho allocate; MQTT's own bound is
// 256 MiB.
const DefaultMaxPacketBytes = 17 << 20

// maxMQTTPacket is the largest packet MQTT can frame: a fixed header of 5
// bytes and the largest Remaining Length.
const maxMQTTPacket = 1 + 4 + 268_435_455

// maxPacket is the packet limit o asks for.
func (o *SessionOptions) maxPacket() int {
	if o.MaxPacketBytes <= 0 {
		return DefaultMaxPacketBytes
	}
	return min(o.MaxPacketBytes, maxMQTTPacket)
}

// Message is one message a subscriber received, over either version.
type Message struct {
	Topic   string // the topic it was published to
	Payload []byte
	// ContentType and User are the message's MQTT 5 properties; empty
	// over 3.1.1.
	ContentType string
	User        []UserProperty
	// ResponseTopic and CorrelationData are MQTT 5's request/response
	// properties, as the sender gave them; empty over 3.1.1.
	ResponseTopic   string
	CorrelationData []byte
	// MessageExpiry is what was left of the message's MQTT 5 Message
	// Expiry Interval when the broker sent it (whole seconds; under one
	// second left reads as 1 ns: it ends now); 0 means none.
	MessageExpiry time.Duration

	ack interface{ Ack() }
}

// Ack acknowledges the message (its PUBACK), once it has been dealt with
// for good. Over a connection that is gone it does nothing: the broker
// delivers the message again.
func (m Message) Ack() { m.ack.Ack() }

// Subscribe runs one session of a subscriber for the attempt a, in the
// version it says, until the connection is lost or fails (an error) or ctx
// ends (nil). Unless o.CleanSession, the session persists on the broker
// (3.1.1's clean session false; 5's Clean Start false, with a session that
// never expires), so that what is published while the subscriber is away
// waits for it.
//
// handle gets each message in arrival order, one at a time, and
// acknowledges it when it is done with it; it returns false when ctx ended
// first. A resumed session's messages come before the SUBACK, as many as
// the broker holds: they are handled while the SUBSCRIBE is under way.
func Subscribe(ctx context.Context, a *Attempt, o *SessionOptions, handle func(context.Context, Message) bool) error {
	if a.V5 {
		return session5(ctx, a, o, handle)
	}
	return session311(ctx, a, o, handle)
}

// connected notes a connection the broker accepted.
func (o *SessionOptions) connected(protocol string) {
	if o.Connected != nil {
		o.Connected(protocol)
	}
}

// subscribed notes the SUBACK.
func (o *SessionOptions) subscribed(a *Attempt, protocol string) {
	if o.Subscribed != nil {
		o.Subscribed()
	}
	o.Logger.Info("outbox subscriber connected", "broker", Redact(a.URL), "topics", o.Topics, "protocol", protocol)
}

// ValidateSubscription checks a topic filter, and a shared subscription's
// form: "$share/", a group name that is not empty and holds no + or #, "/"
// and a filter.
func ValidateSubscription(t string) error {
	if t == "" {
		return errors.New("outbox: subscriber: an empty topic filter")
	}
	rest, shared := strings.CutPrefix(t, "$share/")
	if !shared {
		if t == "$share" {
			return fmt.Errorf("outbox: subscriber: shared subscription %q: want $share/group/filter", t)
		}
		return nil
	}
	group, filter, _ := strings.Cut(rest, "/")
	switch {
	case group == "":
		return fmt.Errorf("outbox: subscriber: shared subscription %q: the group name is empty (want $share/group/filter)", t)
	case strings.ContainsAny(group, "+#"):
		return fmt.Errorf("outbox: subscriber: shared subscription %q: the group name %q may not hold + or #", t, group)
	case filter == "":
		return fmt.Errorf("outbox: subscriber: shared subscription %q: no topic filter after the group name (want $share/group/filter)", t)
	}
	return nil
}
