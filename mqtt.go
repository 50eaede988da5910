package outbox

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	packets311 "github.com/eclipse/paho.mqtt.golang/packets"
	netproxy "golang.org/x/net/proxy"
)

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

// MQTTPublisher publishes to an MQTT broker at QoS 1 over MQTT 5 or 3.1.1
// (MQTTOptions.Protocol), for a Relay. It opens a fresh clean session for
// every Connect and never reconnects by itself: a reconnection under the
// hood (paho.mqtt.golang's automatic one) can complete a QoS 1 token
// without a PUBACK, so the relay does it instead.
type MQTTPublisher struct {
	opts MQTTOptions
	urls []*url.URL
	mem  []brokerMemory // per address, what auto learnt
	next int            // the address the next Connect tries

	url *url.URL // the address of the last Connect; under mu
	at  int      // its index; under mu

	wg   sync.WaitGroup
	mu   sync.Mutex
	conn *mqttConn // the connection of the last Connect, either version

	// control, if set, is given every socket before it connects: tests
	// use it to shrink the send buffer, as on a device whose writes block.
	control func(network, address string, c syscall.RawConn) error
}

// brokerMemory is what auto learnt of one address: no5 once its CONNACK
// said it does not speak 5, for the publisher's life; bareCloses counts 5
// CONNECTs in a row that it closed without a CONNACK, and after two, 3.1.1
// is spoken until retry5At.
type brokerMemory struct {
	no5        bool
	bareCloses int
	retry5At   time.Time
}

// use311 reports whether auto speaks 3.1.1 to this broker now.
func (m *brokerMemory) use311(now time.Time) bool { return m.no5 || now.Before(m.retry5At) }

// learn records how an MQTT 5 connect to this broker ended. It returns
// why auto falls back to 3.1.1 now, for the log, or "" to stay on 5.
// The publisher and the Subscriber keep one each, under their own lock.
func (m *brokerMemory) learn(err error, now time.Time) (fallback string) {
	switch {
	case err == nil:
		m.bareCloses = 0
	case errors.Is(err, errUnsupportedVersion):
		m.no5 = true
		return "the broker does not speak MQTT 5; speaking 3.1.1 from now on"
	case errors.Is(err, errClosedAfterConnect):
		m.bareCloses++
		if m.bareCloses >= 2 {
			m.bareCloses = 0
			m.retry5At = now.Add(retry5After)
			return "the broker closed two MQTT 5 CONNECTs in a row without a CONNACK; speaking 3.1.1, trying 5 again in " + retry5After.String()
		}
	}
	return ""
}

// NewMQTTPublisher checks opts and returns a publisher; it connects only
// when the relay asks.
func NewMQTTPublisher(opts MQTTOptions) (*MQTTPublisher, error) {
	urls, err := parseBrokers("mqtt", opts.Broker, opts.Brokers)
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
		if slices.ContainsFunc(urls, func(u *url.URL) bool { return !isTLS(u) }) {
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
	first := firstBroker(opts.ClientID, len(urls))
	return &MQTTPublisher{opts: opts, urls: urls, mem: make([]brokerMemory, len(urls)), next: first, url: urls[first], at: first}, nil
}

// Broker returns the address (its URL, without credentials) of the last
// Connect: the one in use while connected.
func (p *MQTTPublisher) Broker() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return redactURL(p.url)
}

// ParseBrokerURL checks a broker URL: scheme tcp, mqtt, ssl, tls or mqtts,
// a host and a port.
func ParseBrokerURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("outbox: broker URL: %w", err)
	}
	switch strings.ToLower(u.Scheme) {
	case "tcp", "mqtt", "ssl", "tls", "mqtts":
	default:
		return nil, fmt.Errorf("outbox: broker URL %q: scheme must be tcp, mqtt, ssl, tls or mqtts", redactURL(u))
	}
	if u.Hostname() == "" || u.Port() == "" {
		return nil, fmt.Errorf("outbox: broker URL %q: needs host and port", redactURL(u))
	}
	return u, nil
}

func redactURL(u *url.URL) string {
	if u.User == nil {
		return u.String()
	}
	c := *u
	c.User = url.User("REDACTED")
	return c.String()
}

// pahoOptions builds what the Subscriber's 3.1.1 connections share: MQTT
// 3.1.1, no reconnection by paho (the caller reconnects, with backoff), TLS
// for a TLS URL (TLS 1.2 at least unless a config is given), credentials and
// timeouts.
func pahoOptions(u *url.URL, clientID, username, password string, tlsCfg *tls.Config, connect, keepAlive, ping time.Duration) *mqtt.ClientOptions {
	o := mqtt.NewClientOptions()
	o.AddBroker(u.Scheme + "://" + u.Host)
	o.SetClientID(clientID)
	if username != "" {
		o.SetUsername(username)
		o.SetPassword(password)
	}
	if isTLS(u) {
		if tlsCfg == nil {
			tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.SetTLSConfig(tlsCfg)
	}
	o.SetProtocolVersion(4)
	o.SetAutoReconnect(false)
	o.SetConnectRetry(false)
	o.SetConnectTimeout(connect)
	o.SetKeepAlive(keepAlive)
	o.SetPingTimeout(ping)
	return o
}

func isTLS(u *url.URL) bool {
	switch strings.ToLower(u.Scheme) {
	case "ssl", "tls", "mqtts":
		return true
	}
	return false
}

// retry5After is how long auto speaks 3.1.1 after two bare closes before it
// tries 5 again: the closes may have been an outage, not a broker without 5.
const retry5After = 10 * time.Minute

// Connect opens a new connection with a clean session, in the version
// MQTTOptions.Protocol asks for.
func (p *MQTTPublisher) Connect(ctx context.Context) error {
	p.Disconnect()
	p.mu.Lock()
	p.at, p.url = p.next, p.urls[p.next]
	p.next = (p.next + 1) % len(p.urls)
	m := &p.mem[p.at]
	p.mu.Unlock()
	switch p.opts.Protocol {
	case Protocol311:
		return p.connect311(ctx)
	case Protocol5:
		return p.connectV5(ctx)
	}
	p.mu.Lock()
	use311 := m.use311(time.Now())
	p.mu.Unlock()
	if use311 {
		return p.connect311(ctx)
	}
	err := p.connectV5(ctx)
	p.mu.Lock()
	fallback := m.learn(err, time.Now())
	p.mu.Unlock()
	if fallback == "" {
		return err
	}
	p.opts.Logger.Info("outbox mqtt: "+fallback, "broker", redactURL(p.url), "err", err)
	return p.connect311(ctx)
}

// connectV5 connects with MQTT 5.
func (p *MQTTPublisher) connectV5(ctx context.Context) error {
	cn, err := p.connect5(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var why string
		var ce *connackError
		if errors.As(err, &ce) {
			why = explainConnack(ce)
		} else {
			why = explainConnectError(err, time.Now())
		}
		return fmt.Errorf("outbox: mqtt 5 connect to %s: %s: %w", redactURL(p.url), why, err)
	}
	p.mu.Lock()
	p.conn = cn
	p.mu.Unlock()
	p.opts.Logger.Debug("outbox mqtt: connected", "broker", redactURL(p.url), "protocol", "5",
		"receive_maximum", cn.receiveMax, "maximum_packet_size", cn.maxPacket)
	return nil
}

// connect311 connects with MQTT 3.1.1.
func (p *MQTTPublisher) connect311(ctx context.Context) error {
	cn, err := p.open311(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("outbox: mqtt connect to %s: %s: %w", redactURL(p.url), explainConnectError(err, time.Now()), err)
	}
	p.mu.Lock()
	p.conn = cn
	p.mu.Unlock()
	p.opts.Logger.Debug("outbox mqtt: connected", "broker", redactURL(p.url), "protocol", "3.1.1")
	return nil
}

// dialForConnect dials the broker for a CONNECT of either version: until
// stopWatch is called (at the CONNACK), a cancelled ctx closes the
// connection at once, and ConnectTimeout bounds the handshake.
func (p *MQTTPublisher) dialForConnect(ctx context.Context) (conn net.Conn, link *linkConn, stopWatch func() bool, err error) {
	tlsCfg, err := tlsConfigFor(p.opts.TLSConfig, p.opts.TLSFiles)
	if err != nil {
		return nil, nil, nil, err
	}
	conn, link, err = p.dial(p.url, tlsCfg)
	if err != nil {
		return nil, nil, nil, err
	}
	stopWatch = context.AfterFunc(ctx, func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(p.opts.ConnectTimeout))
	return conn, link, stopWatch, nil
}

// open311 opens an MQTT 3.1.1 connection with a clean session; the CONNECT
// and its CONNACK go through paho.mqtt.golang's packets package, whose
// errors for a refusal explainConnectError knows.
func (p *MQTTPublisher) open311(ctx context.Context) (*mqttConn, error) {
	conn, link, stopWatch, err := p.dialForConnect(ctx)
	if err != nil {
		return nil, err
	}
	defer stopWatch()
	cp := packets311.NewControlPacket(packets311.Connect).(*packets311.ConnectPacket)
	cp.ProtocolName, cp.ProtocolVersion, cp.CleanSession = "MQTT", 4, true
	cp.ClientIdentifier = p.opts.ClientID
	cp.Keepalive = uint16(min(p.opts.KeepAlive/time.Second, 65535))
	if p.opts.Username != "" {
		cp.UsernameFlag, cp.Username = true, p.opts.Username
		cp.PasswordFlag, cp.Password = true, []byte(p.opts.Password)
	}
	var b bytes.Buffer
	if err := cp.Write(&b); err != nil {
		conn.Close()
		return nil, err
	}
	if _, err := conn.Write(b.Bytes()); err != nil {
		conn.Close()
		return nil, ctxOr(ctx, err)
	}
	ack, err := packets311.ReadPacket(conn)
	if err != nil {
		conn.Close()
		return nil, ctxOr(ctx, err)
	}
	ca, ok := ack.(*packets311.ConnackPacket)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("outbox: mqtt: the broker answered the CONNECT with %s", ack)
	}
	if ca.ReturnCode != packets311.Accepted {
		conn.Close()
		if known := packets311.ConnErrors[ca.ReturnCode]; known != nil {
			return nil, known
		}
		return nil, &connackError{code: ca.ReturnCode}
	}
	conn.SetDeadline(time.Time{})
	cn := p.newConn(conn, link, true)
	cn.start()
	return cn, nil
}

// dial opens the connection both protocol versions write to: the socket
// (ALL_PROXY honoured) under a linkConn, and TLS on top for a TLS URL, all
// within ConnectTimeout. top is what MQTT is written to.
func (p *MQTTPublisher) dial(uri *url.URL, tlsCfg *tls.Config) (top net.Conn, l *linkConn, err error) {
	deadline := time.Now().Add(p.opts.ConnectTimeout)
	d := &net.Dialer{Deadline: deadline, Control: p.control}
	raw, err := netproxy.FromEnvironmentUsing(d).Dial("tcp", uri.Host)
	if err != nil {
		return nil, nil, err
	}
	l = newLinkConn(raw, p.opts.WriteTimeout)
	if !isTLS(uri) {
		return l, l, nil
	}
	if tlsCfg == nil {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if tlsCfg.ServerName == "" {
		// As tls.Dial does.
		tlsCfg = tlsCfg.Clone()
		tlsCfg.ServerName = uri.Hostname()
	}
	tc := tls.Client(l, tlsCfg)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, nil, err
	}
	return tc, l, nil
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
		return failedToken{ErrNotConnected}
	}
	return cn.publish(topic, payload, &props)
}

// CarriesProperties reports whether the connection made by the last Connect
// speaks MQTT 5, so that properties reach the broker.
func (p *MQTTPublisher) CarriesProperties() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn != nil && !p.conn.v311
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
		cn.close()
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
	switch {
	case p.conn != nil:
		return p.conn.lost
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
	case p.conn.v311:
		return "3.1.1"
	}
	return "5"
}

// MaxInFlight is how many publishes the broker lets await their PUBACK on
// the current connection (MQTT 5's Receive Maximum); 0 if it set no limit
// or speaks 3.1.1. The relay's window is never wider.
func (p *MQTTPublisher) MaxInFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		return p.conn.receiveMax
	}
	return 0
}

// LostReason is why the broker ended the last connection, when it said
// (an MQTT 5 DISCONNECT with a reason code); nil otherwise.
func (p *MQTTPublisher) LostReason() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		return p.conn.lostReason()
	}
	return nil
}

// CheckSize implements SizeLimiter: a PUBLISH's Remaining Length (the
// topic, the packet id, the properties on MQTT 5, the payload) is at most
// 268,435,455 bytes.
func (p *MQTTPublisher) CheckSize(topic string, payloadBytes int, props *PublishProperties) error {
	if remainingLength(topic, payloadBytes, props, props != nil) > maxRemainingLength {
		return fmt.Errorf("encoded message of %d bytes exceeds MQTT's limit", payloadBytes)
	}
	return nil
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
	_ ProgressToken       = (*pubToken)(nil)
)
