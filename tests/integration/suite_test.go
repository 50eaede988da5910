package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// The broker suite: the same cases over every broker the relay is tested
// with. Each broker is a constructor (it starts what the cases need, on free
// loopback ports, for the length of its test) and the features it differs
// in; the cases read the features, not the broker's name. A broker that is
// not installed skips its test with a line saying what to install.
//
//	go test -race -run 'TestNATS|TestRabbitMQ' -v ./tests/integration
//	go test -race -run 'TestEjabberd/mqtt_5/TLS' -v ./tests/integration

// features are what a broker does differently, as the cases see it.
type features struct {
	// MQTT5: the broker speaks MQTT 5, and the suite runs twice, under 5
	// and under 3.1.1; otherwise under 3.1.1 only, and auto is shown to
	// fall back to it.
	MQTT5 bool
	// AcksDeniedPublish: under MQTT 3.1.1, a publish the broker's rules
	// deny is acknowledged and dropped. A 3.1.1 PUBACK has no reason code,
	// so the relay cannot tell it from a delivery and marks it sent.
	// Otherwise the broker closes the connection, and the isolation rule
	// parks the message as dead after MaxAttempts while the rest flows.
	AcksDeniedPublish bool
	// DeniedReason5: under MQTT 5, the PUBACK of a denied publish carries
	// this reason (words and code, as last_error has it), and the message
	// is parked as dead at once on a connection kept. "": the broker
	// acknowledges and drops it under 5 too.
	DeniedReason5 string
	// RefusesDotInTopics: a publish to a topic with '.' or ' ' closes the
	// connection (NATS maps topics to subjects), so such a message is
	// parked as dead after MaxAttempts.
	RefusesDotInTopics bool
	// SessionsSurviveRestart: a persistent session, and the messages queued
	// for it, survive a restart of the broker.
	SessionsSurviveRestart bool
	// TLSOnly: with TLS on, the broker's TLS listener is its only one, so
	// the suite's subscriber connects over TLS with a client certificate.
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
	inline  func(t *testing.T, filter string) *harness.EventLog
	log     func() string                     // the broker's log so far; nil if none is kept
	restart func(downFor time.Duration) error // nil: the suite cannot restart it

	// proto is the MQTT version the case's relays speak; suffix ends the
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
		return tg.inline(t, filter)
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
	logSilent               []string // what it does not say
}

// brokerSet is what a broker's constructor started for the suite.
type brokerSet struct {
	plain      *target // for the order, outage, withheld PUBACK, topic and restart cases
	tls        *target // a listener that requires a client certificate from the fleet CA; nil: not tested
	denial     *denial // nil: no rule set up to deny a publish
	tlsLogSays string  // after the TLS cases, the broker's log says this; "" for no check
	pki        *harness.BrokerTLS
	proto      outbox.MQTTProtocol // the run's MQTT version
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

// brokerKind is one broker the suite runs over.
type brokerKind struct {
	name     string
	features features
	// start starts the broker, as many times and ways as its set needs,
	// for the length of t; its TLS listener uses pki.
	start func(t *testing.T, pki *harness.BrokerTLS) *brokerSet
	// extra are cases of this broker's own, run after the suite's.
	extra []brokerCase
}

// brokerCase is one case of the suite.
type brokerCase struct {
	name string
	run  func(t *testing.T, k brokerKind, set *brokerSet)
}

// suiteCases run over every broker, in this order: the restart comes last,
// as the cases share the broker.
var suiteCases = []brokerCase{
	{"compatibility", compatibility},
	{"topics with a dot or a space", topicsWithDots},
	{"denied publish", deniedPublish},
	{"TLS", tlsCases},
	{"session survives a restart", sessionSurvivesRestart},
}

// runBrokerSuite starts k's brokers and runs every case against them: under
// MQTT 5 and then 3.1.1 where the broker has 5, else under 3.1.1 and then
// the case that shows auto falling back to it.
func runBrokerSuite(t *testing.T, k brokerKind) {
	pki := harness.NewBrokerTLS(t)
	set := k.start(t, pki)
	set.pki = pki
	protos := []outbox.MQTTProtocol{outbox.Protocol311}
	if k.features.MQTT5 {
		protos = []outbox.MQTTProtocol{outbox.Protocol5, outbox.Protocol311}
	}
	for _, proto := range protos {
		vset := set.on(proto)
		t.Run("mqtt "+proto.String(), func(t *testing.T) {
			for _, c := range append(suiteCases, k.extra...) {
				t.Run(c.name, func(t *testing.T) { c.run(t, k, vset) })
			}
		})
	}
	if !k.features.MQTT5 {
		t.Run("auto falls back to 3.1.1", func(t *testing.T) { autoFallsBack(t, k, set) })
	}
}

// newRelay is a relay from ob to the broker at url, logging in with l,
// under client id clientID ("": a random one), speaking auto.
func newRelay(t *testing.T, ob *outbox.Outbox, url string, l login, clientID string, opts outbox.RelayOptions) *outbox.Relay {
	t.Helper()
	return newRelayOn(t, ob, url, l, clientID, opts, outbox.ProtocolAuto)
}

// newRelayOn is newRelay speaking proto.
func newRelayOn(t *testing.T, ob *outbox.Outbox, url string, l login, clientID string, opts outbox.RelayOptions, proto outbox.MQTTProtocol) *outbox.Relay {
	t.Helper()
	if clientID == "" {
		clientID = "relay-" + outbox.NewID()[24:]
	}
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: url, ClientID: clientID, Username: l.username, Password: l.password,
		ConnectTimeout: 2 * time.Second, WriteTimeout: time.Second, KeepAlive: 2 * time.Second, PingTimeout: time.Second,
		Protocol: proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	return r
}

// compatibility runs the relay's core cases through a fault proxy, with a
// subscriber to pos/# straight at the broker: 300 events in order; an
// outage in the middle with 100 more committed; a PUBACK withheld until the
// connection drops, after which the event is sent again and only then
// marked sent.
func compatibility(t *testing.T, _ brokerKind, set *brokerSet) {
	tg := set.plain
	sub := tg.subscribe(t, "compatibility", "pos/#")
	p := harness.StartFaultProxy(t, tg.addr)
	ob := openTest(t, outbox.Options{})
	r := newRelayOn(t, ob, p.URL(), tg.login, "", fastRelay(), tg.proto)
	startRelay(t, r)

	for i := 0; i < 300; i++ {
		commitOrder(t, ob, "pos/orders", i)
	}
	harness.Eventually(t, 20*time.Second, "delivered", func() bool { return sub.Unique() == 300 })

	// An outage: the relay cannot reach the broker while the till sells.
	p.Down()
	harness.Eventually(t, 5*time.Second, "relay notices", func() bool { s, _ := r.Stats(context.Background()); return !s.Connected })
	for i := 300; i < 400; i++ {
		commitOrder(t, ob, "pos/orders", i)
	}
	require.NoError(t, p.Up())
	harness.Eventually(t, 20*time.Second, "delivered after the outage", func() bool { return sub.Unique() == 400 })

	// A PUBACK that never comes back, then the connection drops: resent,
	// never marked sent before.
	p.Drop(harness.ToClient)
	commitOrder(t, ob, "pos/orders", 400)
	harness.Eventually(t, 10*time.Second, "the broker has it", func() bool { return sub.Unique() == 401 })
	state, _ := rowState(t, ob, 401)
	require.Equal(t, "pending", state, "not marked sent without its PUBACK")
	p.EndDrop()
	harness.Eventually(t, 10*time.Second, "acknowledged after the resend", func() bool { s, _ := rowState(t, ob, 401); return s == "sent" })

	got := sub.Snapshot()
	require.Empty(t, got.Disorder, "first deliveries in commit order")
	require.Zero(t, got.DecodeErrors)
	require.Zero(t, countState(t, ob, "dead"))
	t.Logf("%s: 401 events delivered in order, %d duplicates, 0 dead", tg.name, got.Duplicates)
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
	if !k.features.RefusesDotInTopics {
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

// deniedPublish publishes, between two allowed ones, a message the
// broker's rules deny. Under MQTT 5 a broker that says so in the PUBACK's
// reason code has it parked as dead at once, on the same connection, none
// of them marked sent before, and the rest delivered in order. A broker
// that acknowledges it and drops it leaves the relay nothing to see: the
// row is marked sent, the connection stays up, and only the broker (its
// log, or not even that) knows. The defence is then at the device: topics
// built from one prefix the broker allows (TopicPrefix). A broker that
// closes the connection has the message parked as dead after MaxAttempts,
// and the rest flows.
func deniedPublish(t *testing.T, k brokerKind, set *brokerSet) {
	d := set.denial
	if d == nil {
		t.Skipf("%s: no rule is set up here to deny a publish", k.name)
	}
	tg := d.target
	sub := tg.subscribe(t, "denied", d.filter)
	ob := openTest(t, outbox.Options{})
	opts := fastRelay()
	opts.Retry = fastRetry(2)
	r := newRelayOn(t, ob, "tcp://"+tg.addr, tg.login, "till-1", opts, tg.proto)
	startRelay(t, r)
	commitOrder(t, ob, d.allowed, 1)
	commitOrder(t, ob, d.denied, 2)
	commitOrder(t, ob, d.allowed, 3)
	if tg.proto == outbox.Protocol5 && k.features.DeniedReason5 != "" {
		harness.Eventually(t, 20*time.Second, "the denied one dead, the others sent", func() bool {
			return countState(t, ob, "dead") == 1 && countState(t, ob, "sent") == 2
		})
		harness.Eventually(t, 5*time.Second, "the allowed two delivered", func() bool { return sub.Unique() == 2 })
		state, attempts := rowState(t, ob, 2)
		require.Equal(t, "dead", state)
		require.Equal(t, 1, attempts, "dead at the first refusal")
		dead, err := ob.List(context.Background(), outbox.ListOptions{State: outbox.StateDead})
		require.NoError(t, err)
		require.Equal(t, k.features.DeniedReason5, dead[0].LastError)
		got := sub.Snapshot()
		require.Empty(t, got.Disorder, "the allowed ones in commit order")
		s, err := r.Stats(context.Background())
		require.NoError(t, err)
		require.True(t, s.Connected, "the connection was kept")
		require.Equal(t, "5", s.Protocol)
		if d.logSays != "" {
			require.Contains(t, tg.log(), d.logSays, "the broker's log says it too")
		}
		t.Logf("%s, MQTT 5: a denied publish refused with %s, dead at once, connection kept", tg.name, dead[0].LastError)
		return
	}
	if !k.features.AcksDeniedPublish {
		harness.Eventually(t, 20*time.Second, "the denied one dead, the others sent", func() bool {
			return countState(t, ob, "dead") == 1 && countState(t, ob, "sent") == 2
		})
		harness.Eventually(t, 5*time.Second, "the allowed two delivered", func() bool { return sub.Unique() == 2 })
		state, attempts := rowState(t, ob, 2)
		require.Equal(t, "dead", state)
		require.Equal(t, 2, attempts)
		return
	}
	harness.Eventually(t, 10*time.Second, "all three acknowledged", func() bool { return countState(t, ob, "sent") == 3 })
	harness.Eventually(t, 5*time.Second, "the allowed two delivered", func() bool { return sub.Unique() == 2 })
	s, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.True(t, s.Connected, "the connection was not dropped")
	require.Zero(t, countState(t, ob, "dead"))
	// A fence: the broker forwards one connection's messages in order, so
	// once a later one has arrived the denied one is not on its way.
	commitOrder(t, ob, d.allowed, 4)
	harness.Eventually(t, 5*time.Second, "the fence delivered", func() bool { return sub.Unique() == 3 })
	var deniedID string
	require.NoError(t, ob.DB().QueryRow(`SELECT id FROM outbox WHERE seq = 2`).Scan(&deniedID))
	require.False(t, sub.Has(deniedID), "the denied publish was dropped")
	if d.logSays != "" {
		require.Contains(t, tg.log(), d.logSays, "the broker's log is where it shows")
	}
	for _, s := range d.logSilent {
		require.NotContains(t, tg.log(), s, "not in the log")
	}
	if tg.proto == outbox.Protocol5 {
		t.Logf("%s: under MQTT 5 too, a denied publish acknowledged with success, dropped, connection kept", tg.name)
		return
	}
	t.Logf("%s: a denied publish acknowledged, dropped, connection kept", tg.name)
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
	case !k.features.SessionsSurviveRestart:
		t.Skipf("%s keeps no session across a restart", k.name)
	case tg.restart == nil:
		t.Skipf("the suite cannot restart %s", k.name)
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
