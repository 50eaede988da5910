package outbox

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

// explainConnectError says in words what a user can do about a failed
// connection: TLS problems (often a device clock that is wrong before NTP
// syncs) and refused credentials are configuration, not outages.
func explainConnectError(err error, now time.Time) string {
	var invalid x509.CertificateInvalidError
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var alert tls.AlertError
	switch {
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired && invalid.Cert != nil:
		c := invalid.Cert
		if now.Before(c.NotBefore) {
			return fmt.Sprintf("the broker's certificate %q is not valid before %s and this device's clock says %s (is the clock set?)",
				c.Subject.CommonName, c.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		}
		return fmt.Sprintf("the broker's certificate %q expired at %s; this device's clock says %s",
			c.Subject.CommonName, c.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	case errors.As(err, &invalid):
		return "the broker's certificate is not valid here: " + invalid.Error()
	case errors.As(err, &unknown):
		return "the broker's certificate is signed by an unknown authority (give its CA)"
	case errors.As(err, &hostname):
		return "the broker's certificate does not match the name " + hostname.Host
	case errors.As(err, &alert):
		return "the broker refused the TLS handshake (" + alert.Error() + "): check the client certificate and key"
	case strings.Contains(err.Error(), "remote error: tls: "):
		// crypto/tls reports the broker's alert with an unexported type.
		_, why, _ := strings.Cut(err.Error(), "remote error: tls: ")
		return "the broker refused the TLS handshake (" + why + "): check the client certificate and key"
	case errors.Is(err, packets.ErrorRefusedBadUsernameOrPassword):
		return "the broker refused the user name or password (CONNACK 4)"
	case errors.Is(err, packets.ErrorRefusedNotAuthorised):
		return "the broker refused this client: not authorised (CONNACK 5)"
	case errors.Is(err, packets.ErrorRefusedIDRejected):
		return "the broker rejected the client id (CONNACK 2)"
	case errors.Is(err, packets.ErrorRefusedServerUnavailable):
		return "the broker is unavailable (CONNACK 3)"
	case errors.Is(err, packets.ErrorRefusedBadProtocolVersion):
		return "the broker does not speak MQTT 3.1.1 (CONNACK 1)"
	}
	return "cannot connect"
}
