package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/outboxtest"
)

// The broker table: every broker the relay is tested with, each a
// constructor (it starts what the cases need, on free loopback ports, for
// the length of its test) and what it does differently. Under each MQTT
// version the broker speaks, the MQTT publisher runs the conformance suite
// (outboxtest.Run: the delivery guarantees, reading outboxtest.Features),
// then the cases here, which are MQTT's and the brokers' own: topics with
// a dot or a space, TLS, a session that survives a restart, a broker's own
// cases, and auto falling back to 3.1.1. A broker that is not installed
// skips its test with a line saying what to install.
//
//	go test -race -run 'TestNATS|TestRabbitMQ' -v ./tests/integration
//	go test -race -run 'TestMosquitto/mqtt_5/conformance/refusals' -v ./tests/integration
//	go test -race -run 'TestEjabberd/mqtt_5/TLS' -v ./tests/integration

// brokerKind is one broker of the table.
type brokerKind struct {
	name string
	// mqtt5: the broker speaks MQTT 5, and everything runs twice, under 5
	// and under 3.1.1; otherwise under 3.1.1 only, and auto is shown to
	// fall back to it.
	mqtt5 bool
	// denied5 and denied311 are how the broker refuses a publish its rules
	// deny (brokerSet.denial), under each version: the conformance suite's
	// Features but for the protocol, which the run sets.
	denied5, denied311 outboxtest.Features
	// traits are what the cases here read.
	traits traits
	// start starts the broker, as many times and ways as its set needs,
	// for the length of t; its TLS listener uses pki.
	start func(t *testing.T, pki *harness.BrokerTLS) *brokerSet
	// extra are cases of this broker's own, run after the table's.
	extra []brokerCase
}

// traits are what a broker does differently in MQTT's own cases, beyond
// the delivery guarantees.
type traits struct {
	// RefusesDotInTopics: a publish to a topic with '.' or ' ' closes the
	// connection (NATS maps topics to subjects), so such a message is
	// parked as dead after MaxAttempts.
	RefusesDotInTopics bool
	// SessionsSurviveRestart: a persistent session, and the messages queued
	// for it, survive a restart of the broker.
	SessionsSurviveRestart bool
	// TLSOnly: with TLS on, the broker's TLS listener is its only one, so
	// the TLS cases' subscriber connects over TLS with a client certificate.
	TLSOnly bool
	// CertCheckedAtLogin: the broker takes any client certificate, or none,
	// in the TLS handshake and checks it at CONNECT, so every bad one is
	// refused with CONNACK 5 and only its log says why.
	CertCheckedAtLogin bool
	// UTF8CommonName: the broker reads the MQTT user from a client
	// certificate's CN only when the CN is a UTF8String (OpenSSL's
	// encoding; Go's crypto/x509 writes a PrintableString).
	UTF8CommonName bool
}

// login is what a client logs in with; empty fields are not sent.
type login struct {
	username, password string
}

// target is a running broker as a case uses it.
type target struct {
	name        string // the broker and its version, for the logs
	addr        string // the plain MQTT listener, host:port; "" if there is none
	tlsAddr     string // the TLS listener, on a TLS target
	expiredAddr string // a TLS listener whose certificate expired; "" if none
	login       login  // what relays and subscribers log in with

	// inline, if set, subscribes inside the broker's process (mochi)
	// rather than over MQTT.
	inline  func(t *testing.T, filter string, fn func(payload []byte))
	log     func() string                     // the broker's log so far; nil if none is kept
	restart func(downFor time.Duration) error // nil: the tests cannot restart it

	// proto is the MQTT version the run's relays speak; suffix ends the
	// client ids of its subscribers, so that a persistent session of one
	// version's run is not the next one's.
	proto  outbox.MQTTProtocol
	suffix string
}

// on is the target as the run for proto sees it.
func (tg *target) on(proto outbox.MQTTProtocol) *target {
	if tg == nil {
		return nil
	}
	c := *tg
	c.proto, c.suffix = proto, "-v"+proto.String()
	return &c
}

// subscribe starts a persistent-session QoS 1 subscriber straight at the
// broker's plain listener (never through a proxy) until t ends. clientID
// is the case's own: brokers are shared by the cases of one test, and a
// persistent session outlives its connection.
func (tg *target) subscribe(t *testing.T, clientID, filter string) *harness.EventLog {
	t.Helper()
	if tg.inline != nil {
		log := harness.NewEventLog(eventIDSeq)
		tg.inline(t, filter, log.Add)
		return log
	}
	return harness.StartSubscriber(t, tg.addr, harness.SubscriberOptions{ClientID: clientID + tg.suffix, Filter: filter,
		Username: tg.login.username, Password: tg.login.password}, eventIDSeq).Log
}

// denial is a broker set up to refuse some publishes: a relay with client
// id till-1 may publish to allowed and not to denied; filter covers both.
type denial struct {
	target                  *target
	allowed, denied, filter string
	logSays                 string   // what the broker's log says of the denied publish; "" for no check
	logSilent               []string // what it does not say when it acknowledges and drops it
}

// brokerSet is what a broker's constructor started.
type brokerSet struct {
	plain      *target // for the conformance suite, the topic and restart cases
	tls        *target // a listener that requires a client certificate from the fleet CA; nil: not tested
	denial     *denial // nil: no rule set up to deny a publish
	tlsLogSays string  // after the TLS cases, the broker's log says this; "" for no check
	// limited, if set, starts a broker that tells MQTT 5 clients a Receive
	// Maximum of limit, for the conformance suite's window case.
	limited func(t *testing.T, limit int) *target
	pki     *harness.BrokerTLS
	proto   outbox.MQTTProtocol // the run's MQTT version
}

// on is the set as the run for proto sees it.
func (s *brokerSet) on(proto outbox.MQTTProtocol) *brokerSet {
	c := *s
	c.plain, c.tls, c.proto = s.plain.on(proto), s.tls.on(proto), proto
	if s.denial != nil {
		d := *s.denial
		d.target = d.target.on(proto)
		c.denial = &d
	}
	return &c
}

// brokerCase is one of MQTT's own cases.
type brokerCase struct {
	name string
	run  func(t *testing.T, k brokerKind, set *brokerSet)
}

// mqttCases run over every broker after the conformance suite, in this
// order: the restart comes last, as the cases share the broker.
var mqttCases = []brokerCase{
	{"topics with a dot or a space", topicsWithDots},
	{"TLS", tlsCases},
	{"session survives a restart", sessionSurvivesRestart},
}

// runBrokerTests starts k's brokers and runs, under MQTT 5 and then 3.1.1
// where the broker has 5, else under 3.1.1, the conformance suite and the
// cases here; then, for a broker without 5, the case that shows auto
// falling back to 3.1.1.
func runBrokerTests(t *testing.T, k brokerKind) {
	pki := harness.NewBrokerTLS(t)
	set := k.start(t, pki)
	set.pki = pki
	protos := []outbox.MQTTProtocol{outbox.Protocol311}
	if k.mqtt5 {
		protos = []outbox.MQTTProtocol{outbox.Protocol5, outbox.Protocol311}
	}
	for _, proto := range protos {
		vset := set.on(proto)
		t.Run("mqtt "+proto.String(), func(t *testing.T) {
			t.Run("conformance", func(t *testing.T) { outboxtest.Run(t, conformance(k, vset)) })
			for _, c := range append(mqttCases, k.extra...) {
				t.Run(c.name, func(t *testing.T) { c.run(t, k, vset) })
			}
		})
	}
	if !k.mqtt5 {
		t.Run("auto falls back to 3.1.1", func(t *testing.T) { autoFallsBack(t, k, set) })
	}
}

// newRelayOn is a relay from ob to the broker at url, logging in with l,
// under client id clientID ("": a random one), speaking proto.
func newRelayOn(t *testing.T, ob *outbox.Outbox, url string, l login, clientID string, opts outbox.RelayOptions, proto outbox.MQTTProtocol) *outbox.Relay {
	t.Helper()
	r, err := ob.NewRelay(newPublisher(t, url, l, clientID, proto), opts)
	require.NoError(t, err)
	return r
}

// newPublisher is an MQTT publisher to the broker at url, logging in with
// l, under client id clientID ("": a random one), speaking proto, closed
// when t ends.
func newPublisher(t *testing.T, url string, l login, clientID string, proto outbox.MQTTProtocol) *outbox.MQTTPublisher {
	t.Helper()
	if clientID == "" {
		clientID = "relay-" + outbox.NewID()[24:]
	}
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: url, ClientID: clientID, Username: l.username, Password: l.password,
		ConnectTimeout: 2 * time.Second, WriteTimeout: time.Second, KeepAlive: 2 * time.Second, PingTimeout: time.Second,
		Protocol: proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	return pub
}

// topicsWithDots publishes to topics with '.' and ' ' and one without.
// A broker that refuses such topics closes the connection, the way an MQTT
// 3.1.1 broker refuses: the isolation rule parks each as dead after
// MaxAttempts, and the rest flows. Others deliver all three.
func topicsWithDots(t *testing.T, k brokerKind, set *brokerSet) {
	tg := set.plain
	sub := tg.subscribe(t, "topics", "pos/#")
	ob := openTest(t, outbox.Options{})
	opts := fastRelay()
	opts.Retry = fastRetry(2)
	startRelay(t, newRelayOn(t, ob, "tcp://"+tg.addr, tg.login, "", opts, tg.proto))
	commitOrder(t, ob, "pos/a.b", 1)
	commitOrder(t, ob, "pos/a b", 2)
	commitOrder(t, ob, "pos/ok", 3)
	if !k.traits.RefusesDotInTopics {
		harness.Eventually(t, 10*time.Second, "all three sent", func() bool { return countState(t, ob, "sent") == 3 })
		harness.Eventually(t, 5*time.Second, "all three delivered", func() bool { return sub.Unique() == 3 })
		require.Zero(t, countState(t, ob, "dead"))
		return
	}
	harness.Eventually(t, 20*time.Second, "two dead, one sent", func() bool {
		return countState(t, ob, "dead") == 2 && countState(t, ob, "sent") == 1
	})
	harness.Eventually(t, 5*time.Second, "the valid one delivered", func() bool { return sub.Unique() == 1 })
	for _, seq := range []int64{1, 2} {
		state, attempts := rowState(t, ob, seq)
		require.Equal(t, "dead", state)
		require.Equal(t, 2, attempts)
	}
}

// autoFallsBack: against a broker without MQTT 5, a relay speaking auto
// falls back to 3.1.1, delivers, and says so in Stats.
func autoFallsBack(t *testing.T, _ brokerKind, set *brokerSet) {
	tg := set.plain
	sub := tg.subscribe(t, "fallback", "pos/#")
	ob := openTest(t, outbox.Options{})
	r := newRelayOn(t, ob, "tcp://"+tg.addr, tg.login, "", fastRelay(), outbox.ProtocolAuto)
	startRelay(t, r)
	commitOrder(t, ob, "pos/orders", 1)
	harness.Eventually(t, 10*time.Second, "sent", func() bool { return countState(t, ob, "sent") == 1 })
	harness.Eventually(t, 5*time.Second, "delivered", func() bool { return sub.Unique() == 1 })
	s, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, "3.1.1", s.Protocol)
	require.Equal(t, "3.1.1", s.LeaseProtocol)
	t.Logf("%s: auto fell back to 3.1.1 (last error before it: %q)", tg.name, s.LastError)
}

// sessionSurvivesRestart: a broker stopped (gracefully) and started again
// with its data still has a persistent subscriber's session and every
// message queued for it, including those published while it was away. The
// fault test (TestMosquittoBrokerFaults) rests on it.
func sessionSurvivesRestart(t *testing.T, k brokerKind, set *brokerSet) {
	tg := set.plain
	switch {
	case !k.traits.SessionsSurviveRestart:
		t.Skipf("%s keeps no session across a restart", k.name)
	case tg.restart == nil:
		t.Skipf("the tests cannot restart %s", k.name)
	}
	log := harness.NewEventLog(eventIDSeq)
	sub := harness.NewSubscriber(t, tg.addr, harness.SubscriberOptions{ClientID: "persist-check" + tg.suffix, Filter: "orders/#",
		Username: tg.login.username, Password: tg.login.password}, log)
	present, err := sub.Connect()
	require.NoError(t, err)
	require.False(t, present, "a fresh broker has no session for us")
	sub.Disconnect(100) // away: from now on the broker queues for us

	ob := openTest(t, outbox.Options{})
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: "tcp://" + tg.addr, ClientID: "persist-relay", Username: tg.login.username, Password: tg.login.password,
		ConnectTimeout: time.Second, WriteTimeout: time.Second, KeepAlive: time.Second, PingTimeout: 500 * time.Millisecond, Protocol: tg.proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	startRelay(t, r)
	for i := 0; i < 3; i++ {
		commitOrder(t, ob, "orders/persist", i)
	}
	harness.Eventually(t, 10*time.Second, "three acknowledged", func() bool { return countState(t, ob, "sent") == 3 })

	require.NoError(t, tg.restart(0))
	for i := 3; i < 5; i++ {
		commitOrder(t, ob, "orders/persist", i)
	}
	harness.Eventually(t, 10*time.Second, "relay back after the restart", func() bool { return countState(t, ob, "sent") == 5 })

	present, err = sub.Connect()
	require.NoError(t, err)
	defer sub.Disconnect(0)
	require.True(t, present, "the broker kept the persistent session across the restart")
	harness.Eventually(t, 10*time.Second, "the queued messages", func() bool { return log.Unique() == 5 })
	got := log.Snapshot()
	require.Equal(t, []int64{1, 2, 3, 4, 5}, got.FirstSeqs, "queued before and after the restart, in order")
	require.Zero(t, got.DecodeErrors)
}
