package mqtt

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	packets311 "github.com/eclipse/paho.mqtt.golang/packets"
)

// explain says in words what a user can do about a failed connection: TLS
// problems (often a device clock that is wrong before NTP syncs) and
// refused credentials are configuration, not outages.
func explain(err error, now time.Time) string {
	var ce *ConnackError
	if errors.As(err, &ce) {
		return explainConnack(ce)
	}
	return explainConnectError(err, now)
}

// explainConnectError explains what is not a CONNACK of the broker's own
// encoding: a TLS failure, or a 3.1.1 refusal as paho.mqtt.golang's
// packets reports it.
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
	case errors.Is(err, packets311.ErrorRefusedBadUsernameOrPassword):
		return "the broker refused the user name or password (CONNACK 4)"
	case errors.Is(err, packets311.ErrorRefusedNotAuthorised):
		return "the broker refused this client: not authorised (CONNACK 5)"
	case errors.Is(err, packets311.ErrorRefusedIDRejected):
		return "the broker rejected the client id (CONNACK 2)"
	case errors.Is(err, packets311.ErrorRefusedServerUnavailable):
		return "the broker is unavailable (CONNACK 3)"
	case errors.Is(err, packets311.ErrorRefusedBadProtocolVersion):
		return "the broker does not speak MQTT 3.1.1 (CONNACK 1)"
	}
	return "cannot connect"
}

// explainConnack says what a user can do about a refused connection.
func explainConnack(e *ConnackError) string {
	if !e.V5 {
		switch e.Code {
		case 4:
			return "the broker refused the user name or password (CONNACK 4)"
		case 5:
			return "the broker refused this client: not authorised (CONNACK 5)"
		case 2:
			return "the broker rejected the client id (CONNACK 2)"
		case 3:
			return "the broker is unavailable (CONNACK 3)"
		case 1:
			return "the broker does not speak MQTT 3.1.1 (CONNACK 1)"
		}
		return e.Error()
	}
	code := fmt.Sprintf("(CONNACK 0x%02X)", e.Code)
	switch e.Code {
	case 0x86:
		return "the broker refused the user name or password " + code
	case 0x87, 0x8A:
		return "the broker refused this client: " + reasonWords(e.Code) + " " + code
	case 0x85:
		return "the broker rejected the client id " + code
	case 0x88, 0x89:
		return "the broker is unavailable: " + reasonWords(e.Code) + " " + code
	case 0x84:
		return "the broker does not speak MQTT 5 " + code
	}
	return "the broker refused the connection: " + reasonWords(e.Code) + " " + code
}
