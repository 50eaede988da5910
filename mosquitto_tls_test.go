package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// startMosquittoTLS runs a Mosquitto with one TLS listener (its files in
// server) that requires a client certificate from server's CA and a
// password file, and returns its address.
func startMosquittoTLS(t *testing.T, dir string, server harness.ServerTLS, user, password string) string {
	t.Helper()
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

// TestMosquittoTLS runs the relay against a real Mosquitto with a TLS
// listener that requires a client certificate and a password: the right
// setup delivers; no certificate, a wrong CA, an expired broker certificate
// and a wrong password each give one clear error, and in every case the
// message stays pending and uncharged (TestMutualTLSAndCertificateReload
// shows it delivered once the setup is put right).
func TestMosquittoTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	b := harness.NewBrokerTLS(t)
	addr := startMosquittoTLS(t, t.TempDir(), b.Server, "till7", "right-password")
	expiredAddr := startMosquittoTLS(t, t.TempDir(), b.Expired, "till7", "right-password")
	caFile, otherCAFile, certFile, keyFile := b.CAFile, b.OtherCAFile, b.Client.CertFile, b.Client.KeyFile

	cases := []struct {
		name     string
		addr     string
		files    TLSFiles
		password string
		want     string // in the relay's last error; "" means delivered
	}{
		{"right certificate and password", addr, TLSFiles{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}, "right-password", ""},
		{"no client certificate", addr, TLSFiles{CAFile: caFile}, "right-password", "the broker refused the TLS handshake"},
		{"wrong CA", addr, TLSFiles{CAFile: otherCAFile, CertFile: certFile, KeyFile: keyFile}, "right-password", "signed by an unknown authority"},
		{"expired broker certificate", expiredAddr, TLSFiles{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}, "right-password", `"expired-broker" expired at`},
		{"wrong password", addr, TLSFiles{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}, "wrong", "not authorised (CONNACK 5)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ob := openTest(t, Options{})
			commitOrder(t, ob, "pos/orders", 1)
			pub, err := NewMQTTPublisher(MQTTOptions{Broker: "ssl://" + tc.addr, ClientID: "till-7-" + NewID()[30:],
				Username: "till7", Password: tc.password, TLSFiles: &tc.files, ConnectTimeout: 3 * time.Second})
			require.NoError(t, err)
			t.Cleanup(func() { pub.Close() })
			opts := fastRelay()
			opts.Reconnect = Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}
			r, err := ob.NewRelay(pub, opts)
			require.NoError(t, err)
			startRelay(t, r)
			if tc.want == "" {
				eventually(t, 10*time.Second, "delivered", func() bool { return countState(t, ob, "sent") == 1 })
				return
			}
			var last string
			eventually(t, 10*time.Second, "an error", func() bool {
				s, _ := r.Stats(context.Background())
				last = s.LastError
				return strings.Contains(last, tc.want)
			})
			require.NotContains(t, last, tc.password)
			require.NotContains(t, last, "\n", "one line")
			t.Logf("%s: %s", tc.name, last)
			state, attempts := rowState(t, ob, 1)
			require.Equal(t, "pending", state, "nothing lost, nothing dead")
			require.Zero(t, attempts, "a configuration problem never counts against a message")
		})
	}
}
