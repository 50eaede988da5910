package monitor

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/mqtt"
)

// fault is the relay's last error as a shop technician reads it: what
// happened, and what to check or who to call. The status page shows the
// error's own text one click away.
type fault struct {
	Words string
	Hint  string
}

// The hints name outboxctl's flags: a till runs outboxctl. A Go program
// sets the same things in MQTTOptions (Broker, Username, Password,
// ClientID, TLSConfig, Protocol).
const (
	hintNetwork = "Is the network up (cable, Wi-Fi, router)? Is the broker's address right (--broker)? Is a firewall in the way? The relay keeps trying by itself."
	hintLost    = "Usually the network, or the broker restarting: the relay reconnects by itself. If it keeps happening, check the network and the broker's log."
)

// explainFault says err in words, by what it is (errors.Is and errors.As
// on the outbox's errors, MQTT's refusals, TLS's and the network's), not
// by its text, which names addresses and wraps causes. now is the page's
// time, for a certificate that is not valid yet.
func explainFault(err error, now time.Time) fault {
	var (
		connack  *mqtt.ConnackError
		gone     *mqtt.DisconnectError
		invalid  x509.CertificateInvalidError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		alert    tls.AlertError
		record   tls.RecordHeaderError
		dns      *net.DNSError
		netErr   net.Error
	)
	switch {
	case err == nil:
		return fault{}
	case errors.Is(err, outbox.ErrDiskFull):
		return fault{"The device's disk is full: the outbox cannot save its work.",
			"Free space on the disk that holds the database: old logs, downloads, backups you do not need. The relay deletes what it has sent by itself and goes on once there is room."}
	case errors.Is(err, outbox.ErrLeaseLost):
		return fault{"Another relay took over sending this device's events, and this one stopped.",
			"Two relays run on one database: stop the extra one (a second outboxctl relay, or a service started twice)."}
	case errors.As(err, &gone) && gone.Code == 0x8E:
		return fault{"Another client connected to the broker with this device's client id, and the broker dropped this one.",
			"Give every relay a client id of its own (--client-id): two that share one take the connection from each other, forever."}
	case errors.Is(err, outbox.ErrBrokerUnavailable):
		return fault{"The broker answers, but says it cannot take messages for now (it is busy, over its quota or shutting down).",
			"Nothing is wrong on this device and nothing is lost: the events wait here. The broker's operator is needed."}
	case errors.As(err, &connack):
		return connackFault(connack)
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired && invalid.Cert != nil && now.Before(invalid.Cert.NotBefore):
		return fault{"This device's clock is wrong: it says " + now.UTC().Format("2006-01-02 15:04 UTC") + ", before the broker's certificate is valid (" + invalid.Cert.NotBefore.UTC().Format("2006-01-02") + ").",
			"Set the device's clock (is NTP reachable?); the relay connects once it is right."}
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired && invalid.Cert != nil:
		return fault{"The broker's certificate expired on " + invalid.Cert.NotAfter.UTC().Format("2006-01-02") + ".",
			"The broker's operator must renew it. (If it has not expired, this device's clock is wrong: set it.)"}
	case errors.As(err, &unknown):
		return fault{"The broker's certificate is not signed by an authority this device trusts.",
			"Check the CA file the relay is given (--ca-file): it must hold the certificate of the authority that signed the broker's."}
	case errors.As(err, &hostname):
		return fault{"The broker's certificate is for another name than the address the relay uses.",
			"Check the broker's address (--broker): use the name its certificate was issued for."}
	case errors.As(err, &invalid):
		return fault{"The broker's certificate is not valid for this device.",
			"Check the CA file (--ca-file) and the broker's address (--broker); the broker's operator can say which certificate it serves."}
	case errors.As(err, &alert) || strings.Contains(err.Error(), "remote error: tls: "):
		// crypto/tls reports most of the broker's alerts with an
		// unexported type: its text is all there is.
		return fault{"The broker refused this device's TLS certificate.",
			"Check the client certificate and key files (--cert-file, --key-file): both there, a matching pair, not expired, signed by an authority the broker trusts."}
	case errors.As(err, &record):
		return fault{"The broker's port does not speak TLS.",
			"Check the broker's address (--broker): tcp:// for a plain port, ssl:// or mqtts:// with its TLS port (often 8883)."}
	case errors.Is(err, syscall.ECONNREFUSED):
		return fault{"Nothing answers at " + addrOf(err) + ": the broker is not running there.",
			"Is the broker running? Is its address right (--broker)? The relay keeps trying by itself."}
	case errors.As(err, &dns):
		return fault{"The broker's name " + dns.Name + " cannot be found.",
			"Is the broker's address spelt right (--broker)? Is the network up, with a name server?"}
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &netErr) && netErr.Timeout():
		return fault{"The broker at " + addrOf(err) + " cannot be reached.", hintNetwork}
	case errors.Is(err, outbox.ErrStalled):
		return fault{"The connection to the broker stopped moving data.",
			"The network is very slow or broken: check it. The relay reconnects by itself; nothing is lost."}
	case connecting(err) && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, mqtt.ErrClosedAfterConnect)):
		return fault{"The broker's address answers, but closed the connection as this device connected.",
			"Is it the right port for the URL's scheme (tcp:// for a plain port, ssl:// or mqtts:// for a TLS one, often 8883)? The broker's log says why it closed it."}
	case errors.Is(err, outbox.ErrNotConnected), errors.Is(err, mqtt.ErrClosedAfterConnect), errors.Is(err, io.EOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed), errors.As(err, &gone):
		return fault{"The connection to the broker was lost.", hintLost}
	case errors.Is(err, outbox.ErrRejected):
		return fault{"The broker refused a message.",
			"A message it refuses for good is listed under Dead messages with the broker's reason; once the broker's rules allow it, requeue it."}
	}
	return fault{"The relay's last error is not one this page knows.",
		"The error's text below, and the relay's log, say more."}
}

// connackFault says a refused connection in words: the broker's own
// reason, by its MQTT 5 reason code or 3.1.1 return code.
func connackFault(e *mqtt.ConnackError) fault {
	code := e.Code
	if !e.V5 {
		code = map[byte]byte{1: 0x84, 2: 0x85, 4: 0x86, 5: 0x87}[e.Code]
	}
	switch code {
	case 0x86:
		return fault{"The broker refused the user name or password.",
			"Check the user name (--username) and the password (--password-file or --password-env) against the broker's accounts."}
	case 0x87, 0x8A:
		return fault{"The broker refused this device: not authorised.",
			"The broker's access rules do not let this user or client id in: its operator must allow it."}
	case 0x85:
		return fault{"The broker refused this device's client id.",
			"Check --client-id: the broker must accept it (some take only letters and digits, at most 23)."}
	case 0x84:
		return fault{"The broker does not speak the MQTT version asked for.",
			"Set --mqtt-version to one the broker speaks, or leave it out to let the relay find out."}
	}
	return fault{"The broker refused the connection.",
		"The broker's operator can say why (its reason is in the error below)."}
}

// brokerReason is what the broker said of itself in err (an MQTT 5
// reason code, or 3.1.1's return code, in words), or "" if err does not
// carry one.
func brokerReason(err error) string {
	var (
		puback  *mqtt.PubackError
		gone    *mqtt.DisconnectError
		connack *mqtt.ConnackError
	)
	switch {
	case errors.As(err, &puback):
		return puback.Error()
	case errors.As(err, &gone):
		return strings.TrimPrefix(gone.Error(), "the broker disconnected: ")
	case errors.As(err, &connack):
		return strings.TrimPrefix(connack.Error(), "CONNACK ")
	}
	return ""
}

// connecting reports whether err is a failed connection attempt, as
// internal/mqtt's Open says it ("outbox: mqtt 5 connect to URL: ..."),
// rather than a connection lost after it was made.
func connecting(err error) bool {
	return strings.Contains(err.Error(), " connect to ")
}

// addrOf is the address a network error names, or "the broker's address".
func addrOf(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Addr != nil {
		return op.Addr.String()
	}
	return "the broker's address"
}
