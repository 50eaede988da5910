package mqtt

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
