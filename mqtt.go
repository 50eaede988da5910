package outbox

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/edgeoutbox/outbox/internal/mqtt"
)

// This file is the MQTT transport's public face: its options, its
// constructor, and MQTTPublisher, the adapter from internal/mqtt's
// connection to the seam (publisher.go), with the one place that decides
// whose fault an MQTT outcome is (mqttFault). The machinery is beneath it,
// in internal/mqtt.

// MQTTOptions configures an MQTTPublisher.
type MQTTOptions struct {
	// Broker is the broker's URL: tcp://, mqtt:// (plain) or ssl://, tls://,
	// mqtts:// (TLS), with host and port. Broker or Brokers is required.
	Broker string
	// Brokers are the addresses of a clustered broker's nodes, each as for
	// Broker; set this or Broker, not both. Each Connect after the first
	// (the relay connects again after a failed connection or a lost one)
	// moves to the next address, in order, and from the last to the first.
	// The first address a publisher tries is chosen by its ClientID, so
	// that a fleet starts spread over the nodes instead of all on the
	// first, and one device always starts on the same node. What auto
	// learns of MQTT 5 is remembered per address.
	Brokers []string
	// ClientID must be unique per broker. Default: "outbox-" + host name +
	// "-" + process id.
	ClientID string
	// Username and Password authenticate to the broker. They are never
	// logged.
	Username string
	Password string
	// TLSConfig is used for TLS URLs. Nil means the system roots, the
	// broker's host name checked, and TLS 1.2 at least.
	TLSConfig *tls.Config
	// TLSFiles, if set, replaces TLSConfig with files read again at every
	// connection, so that renewed certificates need no restart.
	TLSFiles *TLSFiles
	// ConnectTimeout bounds connecting, including the CONNACK. Default 10 s.
	ConnectTimeout time.Duration
	// WriteTimeout is the longest a write may go without moving a byte: a
	// packet may take longer to write over a slow link, as long as its
	// bytes keep moving. Default 10 s.
	WriteTimeout time.Duration
	// KeepAlive is the MQTT keepalive; a dead connection is noticed within
	// about KeepAlive + PingTimeout. Brokers close a connection on which no
	// whole packet arrived within 1.5 × KeepAlive, so it must be longer
	// than the largest message takes to send over the slowest link.
	// Default 30 s.
	KeepAlive time.Duration
	// PingTimeout is how long to wait for a PINGRESP once the PINGREQ has
	// left (on a slow link it waits behind the bytes before it). Default
	// 10 s.
	PingTimeout time.Duration
	// Protocol is the MQTT version: ProtocolAuto (the default) speaks 5 and
	// falls back to 3.1.1 for a broker without 5; Protocol5 and Protocol311
	// speak only that one. Under 5 the broker's PUBACK reason code decides
	// each message: a refused one is parked as dead or retried, where a
	// 3.1.1 broker may acknowledge and drop it.
	Protocol MQTTProtocol
	// Logger gets the publisher's notes: why auto fell back to 3.1.1 (the
	// relay logs which version each connection speaks). Default
	// slog.Default().
	Logger *slog.Logger
}

// MQTTProtocol is the MQTT version an MQTTPublisher (or a consumer's
// Subscriber) speaks. Its values are internal/mqtt's, so that the one
// converts to the other.
type MQTTProtocol int

const (
	// ProtocolAuto connects with MQTT 5 and falls back to 3.1.1 for a broker
	// that does not speak 5. The default.
	ProtocolAuto = MQTTProtocol(mqtt.Auto)
	// Protocol5 is MQTT 5 only: the broker's reason codes decide each
	// message.
	Protocol5 = MQTTProtocol(mqtt.V5)
	// Protocol311 is MQTT 3.1.1 only.
	Protocol311 = MQTTProtocol(mqtt.V311)
)

// String is the name ParseMQTTProtocol reads: "auto", "5" or "3.1.1".
func (p MQTTProtocol) String() string {
	switch p {
	case ProtocolAuto:
		return "auto"
	case Protocol5:
		return "5"
	case Protocol311:
		return "3.1.1"
	}
	return fmt.Sprintf("MQTTProtocol(%d)", int(p))
}

// ParseMQTTProtocol reads "auto" (or ""), "5" (or "5.0") or "3.1.1" (or
// "311", or "4": 3.1.1's protocol level in CONNECT, as some brokers' and
// clients' settings name it).
func ParseMQTTProtocol(s string) (MQTTProtocol, error) {
	switch s {
	case "", "auto":
		return ProtocolAuto, nil
	case "5", "5.0":
		return Protocol5, nil
	case "3.1.1", "311", "4":
		return Protocol311, nil
	}
	return 0, fmt.Errorf("outbox: mqtt version %q: want auto, 5 or 3.1.1", s)
}

// TLSFiles names PEM files for a TLS connection to the broker. They are read
// again at every connection, so a renewed certificate, key or CA bundle
// takes effect at the next reconnect without a restart.
type TLSFiles struct {
	// CAFile is a CA bundle to verify the broker with. Empty means the
	// system roots.
	CAFile string
	// CertFile and KeyFile are the client certificate and its key, for
	// mutual TLS. Both or neither.
	CertFile string
	KeyFile  string
	// ServerName is the name checked in the broker's certificate. Empty
	// means the host of the broker URL.
	ServerName string
}

// Config reads the files and returns a client TLS configuration: TLS 1.2 at
// least, the broker's certificate and name verified.
func (f TLSFiles) Config() (*tls.Config, error) { return mqtt.TLSFiles(f).Config() }

// ParseBrokerURL checks a broker URL: scheme tcp, mqtt, ssl, tls or mqtts,
// a host and a port from 1 to 65535, nothing else (no user, path, query or
// fragment); e.g. tcp://127.0.0.1:1883. Its error says what is wrong and
// what a good URL looks like.
func ParseBrokerURL(s string) (*url.URL, error) { return mqtt.ParseURL(s) }

// MQTTPublisher publishes to an MQTT broker at QoS 1 over MQTT 5 or 3.1.1
// (MQTTOptions.Protocol), for a Relay. It opens a fresh clean session for
// every Connect and never reconnects by itself: a reconnection under the
// hood (paho.mqtt.golang's automatic one) can complete a QoS 1 token
// without a PUBACK, so the relay does it instead.
type MQTTPublisher struct {
	opts    MQTTOptions
	conf    mqtt.Options  // what each connection is opened with
	brokers *mqtt.Brokers // the addresses, the next to try, what auto learnt

	wg   sync.WaitGroup // the connections' goroutines
	mu   sync.Mutex
	conn *mqtt.Conn // the connection of the last Connect, either version

	// control, if set, is given every socket before it connects: tests
	// use it to shrink the send buffer, as on a device whose writes block.
	control func(network, address string, c syscall.RawConn) error
}

// onlyMQTT311 says that every connection speaks 3.1.1, which carries no
// properties: the relay then refuses what only a property could mark
// (unmarkedPayloads).
func (p *MQTTPublisher) onlyMQTT311() bool { return p.opts.Protocol == Protocol311 }

// NewMQTTPublisher checks opts and returns a publisher; it connects only
// when the relay asks.
func NewMQTTPublisher(opts MQTTOptions) (*MQTTPublisher, error) {
	urls, err := mqtt.ParseBrokers("mqtt", opts.Broker, opts.Brokers)
	if err != nil {
		return nil, err
	}
	if opts.ClientID == "" {
		host, _ := os.Hostname()
		opts.ClientID = "outbox-" + host + "-" + strconv.Itoa(os.Getpid())
	}
	if len(opts.ClientID) > 65535 {
		return nil, fmt.Errorf("outbox: mqtt: client id too long")
	}
	if opts.TLSFiles != nil {
		if slices.ContainsFunc(urls, func(u *url.URL) bool { return !mqtt.IsTLS(u) }) {
			return nil, fmt.Errorf("outbox: mqtt: TLS files need a TLS URL (ssl://, tls:// or mqtts://)")
		}
		// Read them once now, so that a wrong path is a clear error at
		// start rather than a retry loop.
		if _, err := opts.TLSFiles.Config(); err != nil {
			return nil, err
		}
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 10 * time.Second
	}
	if opts.KeepAlive <= 0 {
		opts.KeepAlive = 30 * time.Second
	}
	if opts.PingTimeout <= 0 {
		opts.PingTimeout = 10 * time.Second
	}
	switch opts.Protocol {
	case ProtocolAuto, Protocol5, Protocol311:
	default:
		return nil, fmt.Errorf("outbox: mqtt: unknown Protocol %d", int(opts.Protocol))
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	p := &MQTTPublisher{opts: opts, brokers: mqtt.NewBrokers(urls, opts.ClientID, opts.Logger, "outbox mqtt: ")}
	p.conf = mqtt.Options{
		ClientID: opts.ClientID, Username: opts.Username, Password: opts.Password,
		TLSConfig: opts.TLSConfig, TLSFiles: (*mqtt.TLSFiles)(opts.TLSFiles),
		ConnectTimeout: opts.ConnectTimeout, WriteTimeout: opts.WriteTimeout,
		KeepAlive: opts.KeepAlive, PingTimeout: opts.PingTimeout,
		Logger: opts.Logger, Classify: mqttFault, Goroutines: &p.wg,
	}
	return p, nil
}

// Broker returns the address (its URL, without credentials) of the last
// Connect: the one in use while connected.
func (p *MQTTPublisher) Broker() string { return mqtt.Redact(p.brokers.Current()) }

// Connect opens a new connection with a clean session, to the next address,
// in the version MQTTOptions.Protocol asks for (auto: see ProtocolAuto).
func (p *MQTTPublisher) Connect(ctx context.Context) error {
	p.Disconnect()
	o := p.conf
	o.Control = p.control
	err := p.brokers.Connect(ctx, mqtt.Version(p.opts.Protocol), func(ctx context.Context, a *mqtt.Attempt) error {
		cn, err := mqtt.Open(ctx, a, &o)
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.conn = cn
		p.mu.Unlock()
		return nil
	})
	var ce *mqtt.ConnackError
	if errors.As(err, &ce) && (ce.V5 && brokerStateCode(ce.Code) || ce.V5 && ce.Code == 0x88 || !ce.V5 && ce.Code == 3) {
		// Server unavailable (0x88, or 3.1.1's 3), busy, over quota,
		// rate exceeded, moved: the broker's state, said as such.
		return &brokerUnavailable{err: err}
	}
	return err
}

// Publish sends one message at QoS 1.
func (p *MQTTPublisher) Publish(topic string, payload []byte) Token {
	return p.PublishWithProperties(topic, payload, PublishProperties{})
}

// PublishWithProperties sends one message at QoS 1 with MQTT 5 properties.
// On a connection that speaks 3.1.1 the properties are left out: the relay
// gives none there (CarriesProperties).
func (p *MQTTPublisher) PublishWithProperties(topic string, payload []byte, props PublishProperties) Token {
	p.mu.Lock()
	cn := p.conn
	p.mu.Unlock()
	if cn == nil {
		return mqtt.Failed(ErrNotConnected)
	}
	mp := mqttProperties(&props)
	return cn.Publish(topic, payload, &mp)
}

// CarriesProperties reports whether the connection made by the last Connect
// speaks MQTT 5, so that properties reach the broker.
func (p *MQTTPublisher) CarriesProperties() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn != nil && p.conn.V5()
}

// Disconnect closes the connection at once; tokens in flight complete with
// errors. It does not wait for a write already under way to finish
// (bounded by WriteTimeout); Close does.
func (p *MQTTPublisher) Disconnect() {
	p.mu.Lock()
	cn := p.conn
	p.conn = nil
	p.mu.Unlock()
	if cn != nil {
		cn.Close()
	}
}

// Close disconnects and waits for the publisher's goroutines to end.
func (p *MQTTPublisher) Close() error {
	p.Disconnect()
	p.wg.Wait()
	return nil
}

// ConnectionLost returns a channel closed when the current connection is
// lost, so the relay reconnects without waiting for the next publish.
func (p *MQTTPublisher) ConnectionLost() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		return p.conn.Lost()
	}
	return nil
}

// Protocol is the version the current connection speaks: "5" or "3.1.1";
// "" while not connected.
func (p *MQTTPublisher) Protocol() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.conn == nil:
		return ""
	case p.conn.V5():
		return "5"
	}
	return "3.1.1"
}

// MaxInFlight is how many publishes the broker lets await their PUBACK on
// the current connection (MQTT 5's Receive Maximum); 0 if it set no limit
// or speaks 3.1.1. The relay's window is never wider.
func (p *MQTTPublisher) MaxInFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		return p.conn.ReceiveMaximum()
	}
	return 0
}

// LostReason is why the broker ended the last connection, when it said
// (an MQTT 5 DISCONNECT with a reason code); nil otherwise.
func (p *MQTTPublisher) LostReason() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		if why := p.conn.LostReason(); why != nil {
			return mqttFault(why)
		}
	}
	return nil
}

// CheckSize implements SizeLimiter: a PUBLISH's Remaining Length (the
// topic, the packet id, the properties on MQTT 5, the payload) is at most
// 268,435,455 bytes.
func (p *MQTTPublisher) CheckSize(topic string, payloadBytes int, props *PublishProperties) error {
	var mp mqtt.Properties
	if props != nil {
		mp = mqttProperties(props)
	}
	if mqtt.RemainingLength(topic, payloadBytes, &mp, props != nil) > mqtt.MaxRemainingLength {
		return fmt.Errorf("encoded message of %d bytes exceeds MQTT's limit", payloadBytes)
	}
	return nil
}

// mqttFault is the one place that decides whose fault a failed MQTT publish
// was, in the seam's terms (Token): internal/mqtt reports what happened,
// and every token's error passes through here once, as it completes
// (docs/reason-codes.md has the table, with why).
//   - a reason code that speaks of the broker's own state or capacity
//     (brokerStateCode), on a PUBACK or a DISCONNECT: ErrBrokerUnavailable,
//     an outage that charges no message.
//   - any other PUBACK reason code of 0x80 or more but 0x91: the broker
//     refused this message, and the connection stays up. Those that say
//     retrying cannot help are permanent (permanentPuback); the others go
//     again.
//   - a packet over the broker's Maximum Packet Size: never sent, and it
//     never fits on this connection, so permanent.
//   - the connection moved no bytes before the message had left: a stall.
//   - no connection: never sent (with why the connection ended, if known).
//   - anything else (a lost connection, with or without the broker's
//     DISCONNECT reason; PUBACK 0x91, which speaks of the session's packet
//     ids, not of the message) is the connection's fault.
func mqttFault(err error) error {
	switch e := err.(type) {
	case *mqtt.PubackError:
		switch {
		case brokerStateCode(e.Code):
			return &brokerUnavailable{err: e}
		case e.Code == 0x91:
			return fmt.Errorf("outbox: mqtt: the broker says: %w", e)
		}
		return &Refusal{Reason: e.Error(), Permanent: permanentPuback(e.Code)}
	case *mqtt.PacketTooLargeError:
		return &Refusal{Reason: e.Error(), Permanent: true}
	case *mqtt.StallError:
		return fmt.Errorf("%w: %w", ErrStalled, e.Err)
	}
	if err == mqtt.ErrNotConnected {
		return ErrNotConnected
	}
	if nc, ok := err.(*mqtt.NotConnectedError); ok {
		return fmt.Errorf("%w: %w", ErrNotConnected, nc.Cause)
	}
	var de *mqtt.DisconnectError
	if errors.As(err, &de) && brokerStateCode(de.Code) {
		return &brokerUnavailable{err: err}
	}
	return err
}

// brokerStateCode reports whether an MQTT 5 reason code, on a PUBACK or a
// DISCONNECT, speaks of the broker's state or capacity rather than of the
// message: server busy (0x89), shutting down (0x8B), keep alive timeout
// (0x8D), session taken over (0x8E), receive maximum exceeded (0x93),
// message rate too high (0x96), quota exceeded (0x97), administrative
// action (0x98), use another server (0x9C), server moved (0x9D),
// connection rate exceeded (0x9F), maximum connect time (0xA0).
func brokerStateCode(code byte) bool {
	switch code {
	case 0x89, 0x8B, 0x8D, 0x8E, 0x93, 0x96, 0x97, 0x98, 0x9C, 0x9D, 0x9F, 0xA0:
		return true
	}
	return false
}

// brokerUnavailable is an MQTT outcome that says the broker cannot take
// messages for now: it matches ErrBrokerUnavailable and reads as what the
// broker said.
type brokerUnavailable struct{ err error }

func (e *brokerUnavailable) Error() string {
	var pe *mqtt.PubackError
	var de *mqtt.DisconnectError
	switch {
	case errors.As(e.err, &pe):
		return "the broker says " + pe.Error()
	case !errors.As(e.err, &de):
		return e.err.Error()
	case de.Code == 0x8E:
		// Two relays (or a relay and another client) with one client id
		// take the session from each other in turn, forever.
		return de.Error() + "; another client connected with this client id: do two relays share it?"
	}
	return de.Error()
}

func (e *brokerUnavailable) Unwrap() error        { return e.err }
func (e *brokerUnavailable) Is(target error) bool { return target == ErrBrokerUnavailable }

// permanentPuback reports whether a PUBACK reason code refuses the message
// for good: not authorized (0x87), topic name invalid (0x90), packet too
// large (0x95), payload format invalid (0x99).
func permanentPuback(code byte) bool {
	switch code {
	case 0x87, 0x90, 0x95, 0x99:
		return true
	}
	return false
}

// mqttProperties is p in internal/mqtt's terms. The user properties are
// not copied: UserProperty and mqtt.UserProperty are the same struct (the
// conversion below stops compiling if they part), and a copy would cost an
// allocation per publish in CloudEvents binary mode.
func mqttProperties(p *PublishProperties) mqtt.Properties {
	return mqtt.Properties{ContentType: p.ContentType, User: mqttUser(p.User), MessageExpiry: p.MessageExpiry, CorrelationData: p.CorrelationData}
}

var _ = mqtt.UserProperty(UserProperty{})

func mqttUser(u []UserProperty) []mqtt.UserProperty {
	return unsafe.Slice((*mqtt.UserProperty)(unsafe.Pointer(unsafe.SliceData(u))), len(u))
}

// The capabilities of the seam that MQTTPublisher has.
var (
	_ Publisher           = (*MQTTPublisher)(nil)
	_ PropertiesPublisher = (*MQTTPublisher)(nil)
	_ WindowLimiter       = (*MQTTPublisher)(nil)
	_ SizeLimiter         = (*MQTTPublisher)(nil)
	_ ConnectionWatcher   = (*MQTTPublisher)(nil)
	_ LossExplainer       = (*MQTTPublisher)(nil)
	_ ProtocolNamer       = (*MQTTPublisher)(nil)
	_ BrokerNamer         = (*MQTTPublisher)(nil)
	_ ProgressToken       = (*mqtt.PublishToken)(nil)
	_ NoSubscribersToken  = (*mqtt.PublishToken)(nil)
)

// MQTTCommandOptions configures an MQTTCommandReceiver: its connection
// (fields as for MQTTOptions) and what it subscribes to.
type MQTTCommandOptions struct {
	// Broker or Brokers, as for MQTTOptions. One is required.
	Broker  string
	Brokers []string
	// ClientID is required and must stay the same across restarts: the
	// broker keeps the commands sent while the device is away in the
	// persistent session of this id. It is a second connection beside the
	// relay's, so not the relay's client id.
	ClientID string
	// Username and Password authenticate to the broker. Never logged.
	Username string
	Password string
	// TLSConfig and TLSFiles as for MQTTOptions.
	TLSConfig *tls.Config
	TLSFiles  *TLSFiles
	// Protocol as for MQTTOptions. Over MQTT 5 a command's Response Topic,
	// Correlation Data and Message Expiry Interval are read from its
	// properties; over 3.1.1 only the envelope carries them.
	Protocol MQTTProtocol
	// ConnectTimeout (10 s), KeepAlive (30 s) and PingTimeout (10 s) as for
	// MQTTOptions.
	ConnectTimeout time.Duration
	KeepAlive      time.Duration
	PingTimeout    time.Duration
	// Reconnect is the backoff between connection attempts; it never gives
	// up. Zero fields mean 1 s initially, 1 min at most.
	Reconnect Backoff
	// Topics are the command topic filters, subscribed to at QoS 1; at
	// least one. A shared subscription ($share/...) is refused: the
	// commands of a device are applied in the order one session receives
	// them.
	Topics []string
	// WallClockTrusted says whether the wall clock may judge a command's
	// deadline (docs/commands.md). Nil means DefaultWallClockTrusted.
	WallClockTrusted func() bool
	// Logger gets the receiver's notes, never a payload. Nil means the
	// Outbox's.
	Logger *slog.Logger
}

// MQTTCommandReceiver receives a device's commands over MQTT, at QoS 1 in
// a persistent session, and stores each (StoreCommand) before it
// acknowledges it: a command the broker delivered is neither lost nor
// stored twice, and one it could not store comes again. It also expires,
// and answers, the stored commands whose time has passed (ExpireCommands),
// so that they are answered where no Commands runs. Commands, or an
// application in any language, applies them from the table.
//
// A command's packet may be at most the outbox's MaxPayloadBytes plus 512
// KiB for its topic and properties: the receiver never allocates more for
// one, whatever the broker declares. Over MQTT 5 the broker is told so
// (Maximum Packet Size) and drops a larger command, unanswered; over 3.1.1
// the connection ends at one, and the broker sends it again on the next.
type MQTTCommandReceiver struct{ r *commandReceiver }

// MQTTCommandStats counts what an MQTTCommandReceiver did since it was
// created.
type MQTTCommandStats struct {
	Connected bool
	// Stored counts the commands stored (malformed ones included),
	// Duplicates the deliveries of commands stored before.
	Stored, Duplicates int64
	// StoreErrors counts the failures to store a command: each one ended
	// the session, and the broker delivered the command again.
	StoreErrors int64
	// Expired counts the commands ExpireCommands settled as expired.
	Expired int64
	// LastError is the last error of a connection or a store.
	LastError string
	// Protocol ("5" or "3.1.1") and Broker (its address without
	// credentials) are the last connection's.
	Protocol, Broker string
}

// NewMQTTCommandReceiver checks opts and returns a receiver of this
// Outbox's commands; it connects when Run is called.
func (o *Outbox) NewMQTTCommandReceiver(opts MQTTCommandOptions) (*MQTTCommandReceiver, error) {
	r, err := newCommandReceiver(o, opts)
	if err != nil {
		return nil, err
	}
	return &MQTTCommandReceiver{r: r}, nil
}

// Run connects, subscribes and stores commands until ctx ends; it
// reconnects with backoff for as long as it takes. It returns nil when ctx
// ends.
func (r *MQTTCommandReceiver) Run(ctx context.Context) error { return r.r.run(ctx) }

// Stats returns the receiver's counters.
func (r *MQTTCommandReceiver) Stats() MQTTCommandStats { return r.r.stats() }
