package outbox

import (
	"errors"
	"time"
)

// The broker's own state, as the relay last heard it: a broker that says
// it cannot take messages for now (ErrBrokerUnavailable) holds the queue
// without charging anyone, for as long as it says so. The relay keeps
// what it said and since when, so that an operator sees it in words
// (RelayStats, RelayMetrics, the status page, outbox_broker_unavailable_seconds)
// and an alert can fire when it lasts.

// brokerSaid is what the broker last said of itself.
type brokerSaid struct {
	says  string    // what it said, in words; "" while it takes messages
	since time.Time // when it started saying so, by the relay's clock
}

// noteOutcome records how a connection or a session ended: an error that
// says the broker is unavailable starts or extends what it says (since
// when it first did); any other failure ends it, since the broker no longer
// says so. It reports whether err said the broker is unavailable.
func (r *Relay) noteOutcome(err error) bool {
	if err == nil {
		return false
	}
	if !errors.Is(err, ErrBrokerUnavailable) {
		r.brokerTakes()
		return false
	}
	r.mu.Lock()
	if r.said.says == "" {
		r.said.since = r.ob.now()
		r.log.Warn("outbox relay: the broker says it is unavailable; nothing is charged while it does", "err", err)
	}
	changed := r.said.says != err.Error()
	r.said.says = err.Error()
	r.unavailable.Store(true)
	r.mu.Unlock()
	if changed {
		r.notesChanged()
	}
	return true
}

// brokerTakes ends what the broker said of itself: it acknowledged a
// message, or failed for another reason.
func (r *Relay) brokerTakes() {
	if !r.unavailable.Load() {
		return
	}
	r.mu.Lock()
	if r.said.says != "" {
		r.log.Info("outbox relay: the broker no longer says it is unavailable", "said", r.said.says, "for", r.ob.now().Sub(r.said.since).Round(time.Second))
	}
	r.said = brokerSaid{}
	r.unavailable.Store(false)
	r.mu.Unlock()
	r.notesChanged()
}

// brokerSays returns what the broker says of itself and since when; ""
// while it takes messages.
func (r *Relay) brokerSays() (string, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.said.says, r.said.since
}
