package natsjs

import (
	"errors"
	"fmt"
	"strings"
)

// Subject is the NATS subject that a topic is published to: the subject
// NATS's own MQTT listener gives an MQTT publish to that topic, so that a
// fleet can mix MQTT and JetStream relays on one stream. Each level becomes
// a token: "pos/a" is "pos.a". An empty level (a leading, trailing or
// doubled '/') is the token "/", so the topic "/" is "/./", as nats-server
// 2.9's listener has it. Inside a level, '.' becomes "//" and a space
// "%20" (a literal "%20" then reads as a space), as newer listeners map
// what 2.9's refuses. A topic that no subject can hold is an error: empty,
// with a wildcard ('+', '#', or a level that is just '*' or '>', which
// NATS reads as one) or with a control character, which would end the
// subject on the wire.
func Subject(topic string) (string, error) {
	if topic == "" {
		return "", errors.New("natsjs: empty topic")
	}
	var b strings.Builder
	b.Grow(len(topic) + 8)
	for i, level := range strings.Split(topic, "/") {
		if i > 0 {
			b.WriteByte('.')
		}
		if level == "" {
			b.WriteByte('/')
			continue
		}
		if level == "*" || level == ">" {
			return "", fmt.Errorf("natsjs: topic %q: the level %q is a NATS wildcard", topic, level)
		}
		for j := 0; j < len(level); j++ {
			switch c := level[j]; {
			case c == '.':
				b.WriteString("//")
			case c == ' ':
				b.WriteString("%20")
			case c == '+' || c == '#':
				return "", fmt.Errorf("natsjs: topic %q holds the MQTT wildcard %q", topic, c)
			case c < 0x20 || c == 0x7f:
				return "", fmt.Errorf("natsjs: topic %q holds the control character %#x", topic, c)
			default:
				b.WriteByte(c)
			}
		}
	}
	return b.String(), nil
}
