package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/outboxtest"
)

// Mosquitto 2.0 (the Debian package). Its default max_queued_messages
// (1000) silently drops QoS 1 messages for an offline persistent subscriber
// beyond that count (the harness sets 0); it saves persistent sessions only
// when stopped with SIGTERM. Under MQTT 3.1.1 a QoS 1 publish its ACL
// denies is acknowledged and dropped: the relay marks it sent, and only the
// broker's log shows it (FLEET.md and docs/brokers.md say so). Under MQTT 5 its
// PUBACK says 0x87 (not authorized), and the relay parks it dead at once. It
// tells MQTT 5 clients a Receive Maximum of max_inflight_messages (20 by
// default; the harness's persistent broker sets 100), which caps the relay's
// window (the window case's broker sets less). Its TLS listener here requires a client
// certificate and a password, and is its only listener; a second broker
// has an expired certificate.
//
// TestMosquittoBrokerFaults and TestEndToEndKillBothSides, at the root,
// run against it as well.
var mosquittoKind = brokerKind{
	name:      "Mosquitto",
	mqtt5:     true,
	denied5:   outboxtest.Features{Refusal: outboxtest.RefusedForGood, RefusalReason: "not authorized (0x87)"},
	denied311: outboxtest.Features{Refusal: outboxtest.AckedAndDropped},
	traits:    traits{SessionsSurviveRestart: true, TLSOnly: true},
	start:     startMosquittoSet,
}

func TestMosquitto(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs real brokers")
	}
	runBrokerTests(t, mosquittoKind)
}

func startMosquittoSet(t *testing.T, pki *harness.BrokerTLS) *brokerSet {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	name := "Mosquitto " + m.Version()
	plain := &target{name: name, addr: m.Addr(), restart: m.Restart, log: func() string { return m.LogSince(0) }}

	// The fleet's ACL: anonymous clients read everything under fleet/;
	// each client writes only under fleet/<its client id>/.
	dir := t.TempDir()
	acl := filepath.Join(dir, "acl")
	require.NoError(t, os.WriteFile(acl, []byte("topic read fleet/#\npattern write fleet/%c/#\n"), 0o600))
	a := harness.StartMosquitto(t, harness.MosquittoOptions{Dir: dir, Config: []string{
		"allow_anonymous true", "acl_file " + acl, "persistence false", "log_type all",
	}})
	denying := &target{name: name, addr: a.Addr(), log: func() string { return a.LogSince(0) }}

	const user, password = "till7", "right-password"
	return &brokerSet{
		plain: plain,
		tls: &target{name: name, tlsAddr: startMosquittoTLS(t, pki.Server, user, password),
			expiredAddr: startMosquittoTLS(t, pki.Expired, user, password), login: login{user, password}},
		denial: &denial{target: denying, allowed: "fleet/till-1/orders", denied: "fleet/till-2/orders", filter: "fleet/#",
			logSays: "Denied PUBLISH from till-1"},
		limited: func(t *testing.T, limit int) *target {
			dir := t.TempDir()
			l := harness.StartMosquitto(t, harness.MosquittoOptions{Dir: dir, Config: []string{
				"allow_anonymous true", "persistence false", "max_queued_messages 0", "set_tcp_nodelay true",
				fmt.Sprint("max_inflight_messages ", limit),
			}})
			return &target{name: name, addr: l.Addr()}
		},
	}
}

// startMosquittoTLS runs a Mosquitto with one TLS listener (its files in
// server) that requires a client certificate from server's CA and a
// password, and returns its address.
func startMosquittoTLS(t *testing.T, server harness.ServerTLS, user, password string) string {
	t.Helper()
	dir := t.TempDir()
	passwords := harness.MosquittoPasswordFile(t, dir, user, password)
	m := harness.StartMosquitto(t, harness.MosquittoOptions{Dir: dir, Config: []string{
		"cafile " + server.CAFile,
		"certfile " + server.CertFile,
		"keyfile " + server.KeyFile,
		"require_certificate true",
		"tls_version tlsv1.2",
		"allow_anonymous false",
		"password_file " + passwords,
		"persistence false",
	}})
	return m.Addr()
}
