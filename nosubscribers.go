package outbox

import (
	"sync"
	"sync/atomic"
	"time"
)

// Messages the broker took with no subscriber (NoSubscribersToken; MQTT 5:
// PUBACK 0x10): sent, as far as the relay can make them, yet they reached
// nobody unless a persistent session held them — how events most often
// vanish in an MQTT deployment (a consumer not yet subscribed, a topic
// misspelt). They are counted in total, not per topic: a device may write
// to any number of topics, and a metric label per topic would grow without
// bound. The last topic and when say which; the log names each topic, once
// per noSubscribersWarnEvery.

const (
	noSubscribersWarnEvery = time.Minute
	// noSubscribersTopics bounds the topics remembered to space the
	// warnings: past it, a new topic is warned of only once an old one's
	// interval ran out.
	noSubscribersTopics = 256
)

type noSubscribers struct {
	total    atomic.Int64
	recorded atomic.Int64 // total as the lease last recorded it

	mu     sync.Mutex
	topic  string    // the last one
	at     time.Time // when, by Options.Now
	warned map[string]time.Time
}

// heardByNobody records that the broker took a message to topic with no
// subscriber.
func (r *Relay) heardByNobody(topic string) {
	n := &r.noSubscribers
	total := n.total.Add(1)
	n.mu.Lock()
	n.topic, n.at = topic, r.ob.now()
	warn := n.due(topic, time.Now())
	n.mu.Unlock()
	if warn {
		// The lease tells `outboxctl status`, as often as the log does.
		r.notesChanged()
		r.log.Warn("outbox relay: the broker had no subscriber for the topic (PUBACK 0x10): the message reached nobody unless a persistent session held it; is the consumer subscribed, and is the topic right?",
			"topic", topic, "no_subscribers_total", total)
	}
}

// due reports whether topic is to be warned of at now, and if so records
// it.
func (n *noSubscribers) due(topic string, now time.Time) bool {
	if last, ok := n.warned[topic]; ok && now.Sub(last) < noSubscribersWarnEvery {
		return false
	}
	if _, ok := n.warned[topic]; !ok && len(n.warned) >= noSubscribersTopics {
		for t, at := range n.warned {
			if now.Sub(at) >= noSubscribersWarnEvery {
				delete(n.warned, t)
			}
		}
		if len(n.warned) >= noSubscribersTopics {
			return false
		}
	}
	if n.warned == nil {
		n.warned = make(map[string]time.Time)
	}
	n.warned[topic] = now
	return true
}

// read returns the count, the last topic and when.
func (n *noSubscribers) read() (total int64, topic string, at time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.total.Load(), n.topic, n.at
}

// unrecorded reports whether the count moved since the lease recorded it.
func (n *noSubscribers) unrecorded() bool { return n.total.Load() != n.recorded.Load() }
