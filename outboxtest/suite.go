// Package outboxtest is the conformance suite for transports: Run drives a
// relay through a Publisher and checks the outbox's delivery guarantees
// against what the transport's broker received — order, at least once
// across lost connections, refusals parked with their reason, the window
// and shutdown. A transport's own test describes its broker with a
// Transport (how to make a Publisher, see what the broker routes and inflict
// the faults the cases need) and Features (what it does differently), and
// calls Run.
//
// FakeBroker is an in-memory broker with a Publisher of its own, under the
// test's control: it runs the suite in this package's tests and stands in
// for a real broker wherever a test needs one it can steer.
//
// Every case compares the stream a subscriber received with the rows that
// were committed: every committed event arrives, its first delivery in
// commit order (sequence numbers strictly increasing), nothing else
// arrives, and duplicates only where a case allows them, within the
// relay's bound.
package outboxtest

import (
	"os"
	"strconv"
	"testing"

	"github.com/edgeoutbox/outbox"
)

// Transport is a transport under test, with its broker, as Run sees it.
type Transport struct {
	// Features are what the transport and its broker do differently.
	Features Features
	// Broker prepares a broker for one case, for the length of t: the
	// order, lost-connection, window and shutdown cases each ask for one.
	// It may share one broker between cases (each case publishes to the
	// returned Topic from a new outbox, through new Publishers); a case's
	// subscriber must then see nothing a case before it published.
	// Required.
	Broker func(t *testing.T) Broker
	// Refusing prepares a broker that refuses publishes to the returned
	// Broker.Refused topic, the way Features.Refusal says. Nil: there is
	// no such broker, and the refusal case skips.
	Refusing func(t *testing.T) Broker
	// Limited prepares a broker that lets one connection have at most
	// limit publishes awaiting their acknowledgement, and tells the relay
	// so through the Publisher's WindowLimiter (MQTT 5's Receive Maximum).
	// Nil: the transport has no such limit, and that part of the window
	// case skips.
	Limited func(t *testing.T, limit int) Broker
}

// Broker is one case's broker: how to reach it, see what it routes, and
// inflict faults on the way to it. The faults act on every connection of
// the Publishers this Broker made, never on the subscriber's.
type Broker struct {
	// Publisher returns a new Publisher to the broker, for one relay,
	// closed when the case ends. Required.
	Publisher func() outbox.Publisher
	// Subscribe starts a subscriber that sees what the broker routes to
	// Topic (and to Refused, where the broker lets a subscriber see it),
	// until the case ends, and returns once it is subscribed. It calls got
	// with each message's event, decoded (outbox.DecodeEvent, or
	// DecodeEventMQTT where the transport carries properties), one call
	// at a time, in the order the broker routed them. It must not lose a
	// message to Cut, Down, Withhold or Pause. Required.
	Subscribe func(got func(outbox.Event, error))
	// Topic is where the case publishes: a topic the broker accepts from
	// the Publisher. Required.
	Topic string
	// Refused is, on Transport.Refusing's broker, a topic the broker
	// refuses publishes to, for themselves, as Features.Refusal says.
	Refused string
	// AfterRefusal, if set, is called once the refusal case has settled
	// the refused message: for what the transport can check beyond the
	// outbox (its broker's log, say).
	AfterRefusal func(t *testing.T)
	// Cut closes every connection of the Publishers now; new ones are
	// accepted. It ends Withhold. Required.
	Cut func()
	// Down cuts every connection and makes the broker unreachable until
	// up is called. Nil: the outage part of the lost-connection case skips.
	Down func() (up func())
	// Withhold keeps the broker's acknowledgements from reaching the
	// Publishers, while their publishes still reach the broker and its
	// subscribers, until the next Cut. Nil: the cases that need a
	// withheld acknowledgement skip that part.
	Withhold func()
	// Pause holds every byte on the Publishers' connections, both ways,
	// losing none, until resume is called. Nil: the shutdown case does not
	// show acknowledgements awaited.
	Pause func() (resume func())
	// PeakInFlight, if set, is the most publishes that awaited their
	// acknowledgement at once on one connection, as the broker counted
	// them; the window case checks it.
	PeakInFlight func() int
}

// Features are what a transport and its broker do differently, as the
// cases see it.
type Features struct {
	// Refusal is what the broker does with a publish to Broker.Refused.
	// Required when Transport.Refusing is set.
	Refusal RefusalMode
	// RefusalReason is the refused message's last_error where the refusal
	// says why (RefusedForGood, RefusedForNow): the *outbox.Refusal's
	// reason, in words. "": the case checks only that there is one.
	RefusalReason string
	// Protocol is what RelayStats.Protocol says once the relay is
	// connected (the Publisher's ProtocolNamer). "": not checked.
	Protocol string
}

// RefusalMode is how a broker refuses a publish for itself.
type RefusalMode int

const (
	// RefusedForGood fails the publish's token with a permanent
	// *outbox.Refusal, on a connection kept (an MQTT 5 PUBACK of 0x87): the
	// message is dead at once, after one attempt.
	RefusedForGood RefusalMode = iota + 1
	// RefusedForNow fails the token with a *outbox.Refusal that is not
	// permanent, on a connection kept: the message is retried, and dead
	// after the RetryPolicy's MaxAttempts.
	RefusedForNow
	// RefusedByClosing closes the connection, the way an MQTT 3.1.1 broker
	// refuses a publish: the isolation rule finds the message, charges it,
	// and it is dead after MaxAttempts.
	RefusedByClosing
	// AckedAndDropped acknowledges the publish and routes it nowhere, as
	// MQTT 3.1.1 brokers do with a publish their ACL denies (Mosquitto,
	// ejabberd): the relay cannot tell, and marks it sent.
	AckedAndDropped
)

// String is the mode in words, as the logs and TestFake's subtests name it.
func (m RefusalMode) String() string {
	switch m {
	case RefusedForGood:
		return "refused for good"
	case RefusedForNow:
		return "refused for now"
	case RefusedByClosing:
		return "refused by closing"
	case AckedAndDropped:
		return "acknowledged and dropped"
	}
	return "RefusalMode(" + strconv.Itoa(int(m)) + ")"
}

// Run runs the suite's cases against tr, each as a subtest of t, in this
// order: order, at least once across lost connections, refusals parked
// with their reason, the window, shutdown. The shutdown case checks for
// leaked goroutines with goleak, so Run must not run in parallel with
// other tests. OUTBOX_CONFORMANCE_SCALE=10 commits ten times the events.
func Run(t *testing.T, tr Transport) {
	t.Helper()
	if tr.Broker == nil {
		t.Fatal("outboxtest: Transport.Broker is required")
	}
	if tr.Refusing != nil && (tr.Features.Refusal < RefusedForGood || tr.Features.Refusal > AckedAndDropped) {
		t.Fatalf("outboxtest: Transport.Refusing is set, Features.Refusal is %v", tr.Features.Refusal)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, tr) })
	}
}

// cases are the suite, in the order Run runs them.
var cases = []struct {
	name string
	run  func(t *testing.T, tr Transport)
}{
	{"order", order},
	{"at least once across lost connections", atLeastOnce},
	{"refusals parked with their reason", refusals},
	{"the window", theWindow},
	{"shutdown", shutdown},
}

// scale multiplies the events each case commits
// (OUTBOX_CONFORMANCE_SCALE, default 1).
func scale(t *testing.T) int {
	s := os.Getenv("OUTBOX_CONFORMANCE_SCALE")
	if s == "" {
		return 1
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("OUTBOX_CONFORMANCE_SCALE=%q: want a whole number of at least 1", s)
	}
	return n
}
