package outbox

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

func TestExplainConnectError(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: "broker.example.com"},
		NotBefore: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)}
	expired := fmt.Errorf("dial: %w", x509.CertificateInvalidError{Cert: cert, Reason: x509.Expired})
	require.Contains(t, explainConnectError(expired, now), `"broker.example.com" expired at 2026-06-01T00:00:00Z; this device's clock says 2026-11-30T12:00:00Z`)
	early := time.Date(1970, 1, 1, 0, 0, 10, 0, time.UTC) // an RTC before NTP
	require.Contains(t, explainConnectError(expired, early), "is not valid before 2026-01-01T00:00:00Z and this device's clock says 1970-01-01T00:00:10Z (is the clock set?)")
	require.Contains(t, explainConnectError(x509.UnknownAuthorityError{}, now), "unknown authority")
	require.Contains(t, explainConnectError(x509.HostnameError{Certificate: cert, Host: "10.0.0.9"}, now), "does not match the name 10.0.0.9")
}

// refuseAll refuses every connection as bad credentials would.
type refuseAll struct{ mochi.HookBase }

func (h *refuseAll) ID() string                                               { return "refuse" }
func (h *refuseAll) Provides(b byte) bool                                     { return b == mochi.OnConnectAuthenticate }
func (h *refuseAll) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return false }

func TestRefusedCredentialsAreNotAnOutageOfMessages(t *testing.T) {
	forProtocols(t, testRefusedCredentialsAreNotAnOutageOfMessages)
}

func testRefusedCredentialsAreNotAnOutageOfMessages(t *testing.T, proto MQTTProtocol) {
	b := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(refuseAll)}})

	ob := openTest(t, Options{})
	commitOrder(t, ob, "t", 1)
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: b.URL(), Username: "till", Password: "hunter2-secret", Protocol: proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	opts := fastRelay()
	opts.Reconnect = Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	var last string
	eventually(t, 5*time.Second, "refusal reported", func() bool {
		s, _ := r.Stats(context.Background())
		last = s.LastError
		return s.LastError != ""
	})
	require.Regexp(t, `the broker refused (the user name or password \(CONNACK (4|0x86)\)|this client: not authori[sz]ed \(CONNACK (5|0x87)\))`, last)
	require.NotContains(t, last, "hunter2")
	state, attempts := rowState(t, ob, 1)
	require.Equal(t, "pending", state)
	require.Zero(t, attempts, "refused credentials never count against a message")
}
