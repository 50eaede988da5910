package integration

import (
	"os"
	"testing"

	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/outboxtest"
)

// ejabberd 23.01 (the Debian package), its MQTT broker mod_mqtt
// (internal/harness/ejabberd.go says how it is run and how clients log in).
// Clients publish and subscribe under pos/ and nowhere else.
//
// mod_mqtt keeps a CleanSession=false session (MQTT 3.1.1) for
// session_expiry after its client goes (default 5 minutes), in RAM: a node
// restart loses it. Its queue holds max_queue messages (default 5000); one
// more clears the whole queue and ends the session (mod_mqtt_session.erl).
// It sends a subscriber one QoS 1 message at a time, the next after the
// PUBACK, and acknowledges a publisher's QoS 1 message once it has handed
// it to the subscribers' sessions: the relay has every PUBACK of a backlog
// when the subscriber has about a tenth of it.
//
// A publish its access rules refuse (access_publish) is acknowledged and
// dropped, and the connection stays up. mod_mqtt answers with a PUBACK
// whose reason code says "topic name invalid", but an MQTT 3.1.1 PUBACK has
// no reason code. Unlike Mosquitto, ejabberd does not log it at its default
// level (info).
//
// Its TLS node has a TLS listener only (tls: true, tls_verify: true,
// c2s_cafile: the fleet CA) and no password logins, so a client certificate
// is required. ejabberd checks a client certificate after the handshake,
// not in it: its TLS layer asks for one (naming c2s_cafile's CA) but takes
// any, or none. At CONNECT, a client with no password is authenticated by
// its certificate: verified against c2s_cafile, its CN naming the MQTT user
// (the CONNECT user name, or the client id when there is none). So every
// refusal is a CONNACK 5 (not authorised) and only ejabberd's log says why
// ("TLS verify failed: ..." for one from the fleet CA's name and another
// key; one from another CA is not even sent, as ejabberd names the fleet CA
// in its request). A relay sets Username to its certificate's CN and no
// password. A certificate whose CN is a PrintableString, as Go's
// crypto/x509 writes it, is refused too, although it is from the right CA,
// and the log says no more than "Not authorized".
var ejabberdKind = brokerKind{
	name:  "ejabberd",
	mqtt5: true,
	denied5: outboxtest.Features{Refusal: outboxtest.RefusedForGood,
		RefusalReason: "topic name invalid (0x90): Publishing to this topic is forbidden by service policy"},
	denied311: outboxtest.Features{Refusal: outboxtest.AckedAndDropped},
	traits:    traits{TLSOnly: true, CertCheckedAtLogin: true, UTF8CommonName: true},
	start:     startEjabberdSet,
}

func TestEjabberd(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs real brokers")
	}
	runBrokerTests(t, ejabberdKind)
}

func startEjabberdSet(t *testing.T, pki *harness.BrokerTLS) *brokerSet {
	e := harness.StartEjabberd(t, harness.EjabberdOptions{})
	s := harness.StartEjabberd(t, harness.EjabberdOptions{TLS: &pki.Server})
	logOf := func(file string) func() string {
		return func() string { b, _ := os.ReadFile(file); return string(b) }
	}
	plain := &target{name: "ejabberd " + e.Version, addr: e.MQTTAddr,
		login: login{"till-1", harness.EjabberdPassword}, log: logOf(e.LogFile)}
	return &brokerSet{
		plain: plain,
		// The user is the certificate's CN.
		tls: &target{name: "ejabberd " + s.Version, tlsAddr: s.MQTTTLSAddr, login: login{username: "till-7"}, log: logOf(s.LogFile)},
		denial: &denial{target: plain, allowed: "pos/orders", denied: "other/orders", filter: "pos/#",
			logSilent: []string{"other/orders", "forbidden"}},
		tlsLogSays: "TLS verify failed",
	}
}
