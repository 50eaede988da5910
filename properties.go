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
