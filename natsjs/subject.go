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
// 2.9's listener has it. Inside a level, '.' becomes "//", as 2.10's
// listener maps it (2.9's refuses it). A topic that no subject can hold
// is an error, as on the listener: empty, with white space or a control
// character (which would end the subject on the wire) or a wildcard ('+',
// '#', or a level that is just '*' or '>', which NATS reads as one).
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
			case c == '+' || c == '#':
				return "", fmt.Errorf("natsjs: topic %q holds the MQTT wildcard %q", topic, c)
			case c <= ' ' || c == 0x7f:
				return "", fmt.Errorf("natsjs: topic %q holds white space or a control character (%#x), which no NATS subject can", topic, c)
			default:
				b.WriteByte(c)
			}
		}
	}
	return b.String(), nil
}
