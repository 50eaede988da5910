package outbox

import "time"

// PublishProperties are what an MQTT 5 PUBLISH may carry beside its payload.
// The relay sets them for CloudEvents binary mode (the attributes as user
// properties, the data's content type as the content type) and for a
// message with an expiry (what is left of it); a publisher on a connection
// that cannot carry them (MQTT 3.1.1) is never given any.
type PublishProperties struct {
	// ContentType is MQTT 5's Content Type.
	ContentType string
	// User holds MQTT 5's user properties, in order; a key may repeat.
	User []UserProperty
	// MessageExpiry is MQTT 5's Message Expiry Interval, sent in whole
	// seconds rounded up; 0 means none.
	MessageExpiry time.Duration
}

// UserProperty is one MQTT 5 user property.
type UserProperty struct {
	Key, Value string
}

// empty reports whether p carries nothing.
func (p *PublishProperties) empty() bool {
	return p == nil || p.ContentType == "" && len(p.User) == 0 && p.MessageExpiry <= 0
}

// PropertiesPublisher is implemented by a Publisher that can send MQTT 5
// properties (MQTTPublisher does). The relay asks CarriesProperties after
// each Connect, and publishes a message that has properties with
// PublishWithProperties while it is true; a Publisher without this
// interface keeps receiving Publish, as before.
//
// A type that embeds *MQTTPublisher gets this interface with it: one that
// overrides Publish to see each message must override
// PublishWithProperties too, or messages with properties (over MQTT 5,
// every CloudEvents one: its Content Type) go around it.
type PropertiesPublisher interface {
	Publisher
	// CarriesProperties reports whether the connection made by the last
	// Connect carries properties (it speaks MQTT 5).
	CarriesProperties() bool
	// PublishWithProperties is Publish with properties.
	PublishWithProperties(topic string, payload []byte, props PublishProperties) Token
}

// mqttSecondsUp is d in whole seconds, rounded up, for an MQTT 5 interval.
func mqttSecondsUp(d time.Duration) uint32 {
	s := (d + time.Second - 1) / time.Second
	if s > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(s)
}

// publish hands m to the publisher, with its properties if it has any and
// the connection carries them.
func (s *session) publish(m *row) Token {
	if s.props != nil && !m.props.empty() {
		return s.props.PublishWithProperties(m.topic, m.wire, m.props)
	}
	return s.r.pub.Publish(m.topic, m.wire)
}

// wireSize is how many bytes p takes in a PUBLISH's properties.
func (p *PublishProperties) wireSize() int {
	if p == nil {
		return 0
	}
	n := 0
	if p.ContentType != "" {
		n += 1 + 2 + len(p.ContentType)
	}
	for _, u := range p.User {
		n += 1 + 2 + len(u.Key) + 2 + len(u.Value)
	}
	if p.MessageExpiry > 0 {
		n += 1 + 4
	}
	return n
}

// remainingLength is the Remaining Length of the QoS 1 PUBLISH of a payload
// of n bytes to topic, which MQTT bounds at MaxMQTTPayloadBytes: the topic
// and its length, the packet id, and on MQTT 5 (v5) the properties and
// their length.
func remainingLength(topic string, n int, p *PublishProperties, v5 bool) int {
	rem := 2 + len(topic) + 2 + n
	if v5 {
		props := p.wireSize()
		rem += varintSize(props) + props
	}
	return rem
}

// varintSize is the size of n as an MQTT Variable Byte Integer.
func varintSize(n int) int {
	s := 1
	for ; n >= 128; n >>= 7 {
		s++
	}
	return s
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
	if !carries {
		return nil
	}
	return pp
}
