package natsjs

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeoutbox/outbox"
)

// Options configure a Publisher.
type Options struct {
	// Servers are the NATS servers' URLs (nats://host:4222, tls://…), one
	// per node of a cluster. Each Connect tries the next one, in turn: the
	// relay's backoff is the failover, as for MQTT. Required.
	Servers []string
	// User and Password log in with a user and password; credentials in a
	// server's URL do too.
	User, Password string
	// Token logs in with a token.
	Token string
	// NKeySeedFile is a file holding an NKey seed to log in with.
	NKeySeedFile string
	// CredsFile is a credentials file (a user JWT and its NKey seed), as
	// an operator-mode account issues them.
	CredsFile string
	// TLS, if set, makes every connection TLS with this configuration.
	TLS *tls.Config
	// Name is the connection's name, as the server's monitoring shows it.
	Name string
	// ConnectTimeout bounds each Connect; 0 means 10 s.
	ConnectTimeout time.Duration
	// CreateStream, if set, has each Connect create this stream unless
	// one of its name exists (see StreamSpec); a Connect that can do
	// neither fails. Off by default: streams are the operator's.
	CreateStream *StreamSpec
}

// Publisher publishes to NATS JetStream for the relay: one connection at a
// time, with nats.go's own reconnect and its reconnect buffer off, since
// the relay reconnects and the outbox is the buffer. Each message's
// PubAck decides its outcome: stored, or already stored within the
// stream's duplicate window, is sent.
//
// The event id that Nats-Msg-Id carries is the one in the message as the
// relay encoded it: the "id" attribute of CloudEvents binary mode (a
// PublishWithProperties), else the "id" that the relay's structured-mode
// JSON opens with. A raw-envelope message carries none, and the stream
// cannot deduplicate it.
type Publisher struct {
	opts   Options
	auth   []nats.Option
	stream *streamMaker // Options.CreateStream's, or nil
	// login says how Connect logs in, without the secret, for the error
	// of a refused login.
	login      string
	clientCert bool

	mu   sync.Mutex
	next int    // the server the next Connect tries
	last string // the server of the last Connect, redacted
	conn *conn  // nil while not connected
}

// maxInFlight is above any window the relay allows.
const maxInFlight = 1 << 16

// conn is one connection.
type conn struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	server   string
	lost     chan struct{} // closed when the connection ends
	lostOnce sync.Once
	saidMu   sync.Mutex
	said     error // what the server said that ended the connection

	// inFlight are the tokens of the messages published and not yet
	// answered, by message: nats.go's ack and error handlers settle them,
	// which costs no goroutine a message; nil once the connection ended.
	inFlightMu sync.Mutex
	inFlight   map[*nats.Msg]*token
}

// end settles what is in flight as lost, once, and closes lost.
func (c *conn) end() {
	c.lostOnce.Do(func() {
		c.inFlightMu.Lock()
		lost := c.inFlight
		c.inFlight = nil
		c.inFlightMu.Unlock()
		close(c.lost)
		for _, t := range lost {
			t.settle(fmt.Errorf("natsjs: connection to %s lost before the PubAck", c.server))
		}
	})
}

// add holds t until msg's answer; false once the connection ended.
func (c *conn) add(msg *nats.Msg, t *token) bool {
	c.inFlightMu.Lock()
	defer c.inFlightMu.Unlock()
	if c.inFlight == nil {
		return false
	}
	c.inFlight[msg] = t
	return true
}

// take is msg's token, nil if it was settled already; the one that takes
// it settles it.
func (c *conn) take(msg *nats.Msg) *token {
	c.inFlightMu.Lock()
	defer c.inFlightMu.Unlock()
	t := c.inFlight[msg]
	delete(c.inFlight, msg)
	return t
}

// acked settles msg as stored: a duplicate is already stored, so sent.
func (c *conn) acked(_ jetstream.JetStream, msg *nats.Msg, _ *jetstream.PubAck) {
	if t := c.take(msg); t != nil {
		t.settle(nil)
	}
}

// failed settles msg with the stream's refusal or the server's answer.
func (c *conn) failed(_ jetstream.JetStream, msg *nats.Msg, err error) {
	if t := c.take(msg); t != nil {
		t.settle(publishFault(msg.Subject, err))
	}
}

// say keeps err, the first time it is one by which the server ends a
// connection (an -ERR before it closes it: credentials expired or
// revoked, a stale connection, too many connections).
func (c *conn) say(err error) {
	if err == nil || !serverEnds(err) {
		return
	}
	c.saidMu.Lock()
	defer c.saidMu.Unlock()
	if c.said == nil {
		c.said = err
	}
}

// serverEnds reports whether err is what a server says as it ends a
// connection.
func serverEnds(err error) bool {
	for _, e := range []error{nats.ErrStaleConnection, nats.ErrMaxConnectionsExceeded, nats.ErrMaxAccountConnectionsExceeded} {
		if errors.Is(err, e) {
			return true
		}
	}
	return loginRefused(err)
}

var (
	_ outbox.Publisher           = (*Publisher)(nil)
	_ outbox.PropertiesPublisher = (*Publisher)(nil)
	_ outbox.TopicChecker        = (*Publisher)(nil)
	_ outbox.ConnectionWatcher   = (*Publisher)(nil)
	_ outbox.BrokerNamer         = (*Publisher)(nil)
	_ outbox.SizeLimiter         = (*Publisher)(nil)
	_ outbox.LossExplainer       = (*Publisher)(nil)
	_ outbox.ProtocolNamer       = (*Publisher)(nil)
)

// New returns a Publisher for opts; it does not connect.
func New(opts Options) (*Publisher, error) {
	if len(opts.Servers) == 0 {
		return nil, errors.New("natsjs: no server")
	}
	for _, s := range opts.Servers {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("natsjs: server %q: want nats://host:port", redact(s))
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return nil, fmt.Errorf("natsjs: server %q: scheme %q, want nats, tls, ws or wss", redact(s), u.Scheme)
		}
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	p := &Publisher{opts: opts}
	if opts.CreateStream != nil {
		m, err := newStreamMaker(*opts.CreateStream)
		if err != nil {
			return nil, err
		}
		p.stream = m
	}
	var login []string
	if opts.User != "" || opts.Password != "" {
		p.auth = append(p.auth, nats.UserInfo(opts.User, opts.Password))
		login = append(login, fmt.Sprintf("user %q with a password", opts.User))
	}
	if opts.Token != "" {
		p.auth = append(p.auth, nats.Token(opts.Token))
		login = append(login, "a token")
	}
	if opts.NKeySeedFile != "" {
		o, err := nats.NkeyOptionFromSeed(opts.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("natsjs: NKey seed file: %w", err)
		}
		p.auth = append(p.auth, o)
		login = append(login, "the NKey seed file "+opts.NKeySeedFile)
	}
	if opts.CredsFile != "" {
		p.auth = append(p.auth, nats.UserCredentials(opts.CredsFile))
		login = append(login, "the creds file "+opts.CredsFile)
	}
	if opts.TLS != nil {
		p.auth = append(p.auth, nats.Secure(opts.TLS))
		if p.clientCert = len(opts.TLS.Certificates) > 0 || opts.TLS.GetClientCertificate != nil; p.clientCert {
			login = append(login, "a client certificate")
		}
	}
	p.login = "no credentials"
	if len(login) > 0 {
		p.login = strings.Join(login, " and ")
	}
	return p, nil
}

// redact is s without the password or token a URL may hold.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if i := strings.LastIndexByte(s, '@'); i >= 0 {
			return "…@" + s[i+1:]
		}
		return s
	}
	return u.Redacted()
}

// Protocol is "NATS JetStream" while connected, "" otherwise: what the
// relay's status shows where an MQTT publisher says its version.
func (p *Publisher) Protocol() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return ""
	}
	return "NATS JetStream"
}

// Broker is the server of the last Connect, connected or not, without
// credentials; "" before the first.
func (p *Publisher) Broker() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// ctxDialer dials within a Connect's context.
type ctxDialer struct{ ctx context.Context }

func (d ctxDialer) Dial(network, address string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(d.ctx, network, address)
}

// Connect connects to the next server, closing any connection before.
func (p *Publisher) Connect(ctx context.Context) error {
	p.Disconnect()
	p.mu.Lock()
	server := p.opts.Servers[p.next%len(p.opts.Servers)]
	p.next++
	p.last = redact(server)
	p.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, p.opts.ConnectTimeout)
	defer cancel()
	c := &conn{server: redact(server), lost: make(chan struct{}), inFlight: make(map[*nats.Msg]*token)}
	opts := append([]nats.Option{
		nats.NoReconnect(),
		nats.ReconnectBufSize(-1),
		nats.DontRandomize(),
		nats.Timeout(p.opts.ConnectTimeout),
		nats.SetCustomDialer(ctxDialer{ctx}),
		// nats.go hands an -ERR to the error handler, then the connection's
		// end, in that order, to the disconnect and closed handlers; the
		// error they see is often only the socket's EOF.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub == nil {
				c.say(err)
			}
		}),
		nats.ClosedHandler(func(nc *nats.Conn) { c.say(nc.LastError()); c.end() }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { c.say(err); c.end() }),
	}, p.auth...)
	if p.opts.Name != "" {
		opts = append(opts, nats.Name(p.opts.Name))
	}
	nc, err := nats.Connect(server, opts...)
	if err != nil {
		if loginRefused(err) || p.clientCert && tlsRefused(err) {
			// The server says only "Authorization Violation", or closes a
			// TLS connection whose certificate it refused: which of the
			// credentials it refused is this side's to say.
			return fmt.Errorf("natsjs: connect to %s, logging in with %s: %w", c.server, p.login, err)
		}
		return fmt.Errorf("natsjs: connect to %s: %w", c.server, err)
	}
	// The relay's window bounds what is in flight; nats.go's own bound
	// (4,000 by default) would stall a larger one.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(maxInFlight),
		jetstream.WithPublishAsyncAckHandler(c.acked), jetstream.WithPublishAsyncErrHandler(c.failed))
	if err != nil {
		nc.Close()
		return fmt.Errorf("natsjs: %s: %w", c.server, err)
	}
	if p.stream != nil {
		if err := p.stream.ensure(ctx, js); err != nil {
			nc.Close()
			return err
		}
	}
	c.nc, c.js = nc, js
	p.mu.Lock()
	p.conn = c
	p.mu.Unlock()
	return nil
}

// loginRefused reports whether err is the server's refusal of the
// credentials. At Connect, nats.go returns the server's -ERR as it came,
// which matches its sentinel errors only for "Authorization Violation".
func loginRefused(err error) bool {
	for _, e := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired} {
		if errors.Is(err, e) {
			return true
		}
	}
	text := strings.ToLower(err.Error())
	return strings.Contains(text, "authentication expired") || strings.Contains(text, "authentication revoked")
}

// tlsRefused reports whether err is the server's end of a TLS handshake:
// an alert, or the connection closed right after the handshake (both are
// how a server refuses a client certificate).
func tlsRefused(err error) bool {
	var oe *net.OpError
	return errors.Is(err, nats.ErrTLS) || errors.As(err, &oe) && oe.Op == "remote error"
}

// Disconnect closes the connection; tokens in flight fail.
func (p *Publisher) Disconnect() {
	p.mu.Lock()
	c := p.conn
	p.conn = nil
	p.mu.Unlock()
	if c != nil {
		c.end()
		c.nc.Close()
	}
}

// ConnectionLost is closed when the connection of the last Connect ends.
func (p *Publisher) ConnectionLost() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	return p.conn.lost
}

// LostReason is what the server said as it ended the last connection (a
// user JWT that expired, a stale connection); nil when it said nothing or
// the connection has not ended.
func (p *Publisher) LostReason() error {
	p.mu.Lock()
	c := p.conn
	p.mu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c.lost:
	default:
		return nil
	}
	c.saidMu.Lock()
	defer c.saidMu.Unlock()
	if c.said != nil {
		return fmt.Errorf("natsjs: %s ended the connection: %w", c.server, c.said)
	}
	return nil
}

// CarriesProperties is true: NATS headers carry them.
func (p *Publisher) CarriesProperties() bool { return true }

// CheckTopic refuses a topic that no subject can hold (see Subject).
func (p *Publisher) CheckTopic(topic string) error {
	_, err := Subject(topic)
	return err
}

// CheckSize refuses a message that cannot fit the current connection's
// server's max_payload (payload and headers), so that the relay parks it
// dead before publishing it; while not connected the limit is unknown and
// the publish's token says. The headers counted are those known from
// props: the Nats-Msg-Id of a structured-mode message is not, so a message
// within those bytes of the limit is left to the token.
func (p *Publisher) CheckSize(topic string, payloadBytes int, props *outbox.PublishProperties) error {
	p.mu.Lock()
	c := p.conn
	p.mu.Unlock()
	if c == nil {
		return nil
	}
	limit := c.nc.MaxPayload()
	if n := int64(payloadBytes + headerBytes(props)); limit > 0 && n > limit {
		return tooLarge(n, limit)
	}
	return nil
}

// tooLarge is why a message of n bytes, payload and headers, cannot be
// published to a server whose max_payload is limit.
func tooLarge(n, limit int64) error {
	return fmt.Errorf("natsjs: the message, %d bytes with its headers, exceeds the server's max_payload of %d bytes", n, limit)
}

// headerBytes is, at least, what the headers publish sets for props take
// in a NATS message: the header line, each header line and the blank line.
func headerBytes(props *outbox.PublishProperties) int {
	if props == nil {
		return 0
	}
	n, id := 0, false
	line := func(k, v string) { n += len(k) + len(": ") + len(strings.TrimSpace(v)) + len("\r\n") }
	if props.ContentType != "" {
		line("Content-Type", props.ContentType)
	}
	for _, u := range props.User {
		line("ce-"+u.Key, percentEncode(u.Value))
		if u.Key == "id" && u.Value != "" && !id {
			line(jetstream.MsgIDHeader, u.Value)
			id = true
		}
	}
	if n == 0 {
		return 0
	}
	return n + len("NATS/1.0\r\n") + len("\r\n")
}

// Publish publishes payload to topic's subject.
func (p *Publisher) Publish(topic string, payload []byte) outbox.Token {
	return p.publish(topic, payload, nil)
}

// PublishWithProperties publishes with props as NATS headers, as the
// CloudEvents NATS binding has them: each user property as "ce-" and its
// key, its value percent-encoded, the content type as Content-Type. A message expiry is not carried:
// the relay parks expired messages itself.
func (p *Publisher) PublishWithProperties(topic string, payload []byte, props outbox.PublishProperties) outbox.Token {
	return p.publish(topic, payload, &props)
}

func (p *Publisher) publish(topic string, payload []byte, props *outbox.PublishProperties) outbox.Token {
	t := &token{done: make(chan struct{})}
	p.mu.Lock()
	c := p.conn
	p.mu.Unlock()
	if c == nil {
		return t.fail(fmt.Errorf("natsjs: %w", outbox.ErrNotConnected))
	}
	subject, err := Subject(topic)
	if err != nil {
		return t.fail(&outbox.Refusal{Reason: err.Error(), Permanent: true})
	}
	msg := &nats.Msg{Subject: subject, Data: payload, Header: nats.Header{}}
	id := ""
	if props != nil {
		if props.ContentType != "" {
			msg.Header.Set("Content-Type", props.ContentType)
		}
		for _, u := range props.User {
			msg.Header.Add("ce-"+u.Key, percentEncode(u.Value))
			if u.Key == "id" {
				id = u.Value
			}
		}
	}
	if id == "" {
		id = structuredID(payload)
	}
	if id != "" {
		msg.Header.Set(jetstream.MsgIDHeader, id)
	}
	for k, vs := range msg.Header {
		for _, v := range vs {
			if strings.ContainsAny(k, "\r\n: ") || strings.ContainsAny(v, "\r\n") {
				return t.fail(&outbox.Refusal{Reason: fmt.Sprintf("natsjs: header %q cannot hold a line break", k), Permanent: true})
			}
		}
	}
	if !c.add(msg, t) {
		return t.fail(fmt.Errorf("natsjs: connection to %s lost: %w", c.server, outbox.ErrNotConnected))
	}
	_, err = c.js.PublishMsgAsync(msg, jetstream.WithRetryAttempts(0))
	if err == nil || c.take(msg) == nil {
		return t // answered by acked or failed, or lost by end
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		n := msg.Size() - len(msg.Subject) - len(msg.Reply)
		return t.fail(&outbox.Refusal{Reason: tooLarge(int64(n), c.nc.MaxPayload()).Error(), Permanent: true})
	}
	return t.fail(publishFault(subject, err))
}

// structuredIDPrefix is how the relay's CloudEvents structured mode opens.
const structuredIDPrefix = `{"specversion":"1.0","id":`

// structuredID is the event id of a structured-mode message the relay
// encoded; "" for any other payload.
func structuredID(payload []byte) string {
	rest, ok := bytes.CutPrefix(payload, []byte(structuredIDPrefix))
	if !ok {
		return ""
	}
	// An id with nothing to unescape is its bytes: no decoder a message.
	if len(rest) > 0 && rest[0] == '"' {
		if n := bytes.IndexByte(rest[1:], '"'); n >= 0 {
			if s := rest[1 : 1+n]; plainJSON(s) {
				return string(s)
			}
		}
	}
	var id string
	if err := json.NewDecoder(bytes.NewReader(rest)).Decode(&id); err != nil {
		return ""
	}
	return id
}

// plainJSON reports whether s, the inside of a JSON string, is its own
// value: valid UTF-8 with no escape and no control character.
func plainJSON(s []byte) bool {
	for _, c := range s {
		if c < 0x20 || c == '\\' {
			return false
		}
	}
	return utf8.Valid(s)
}

// token is one publish.
type token struct {
	done chan struct{}
	err  error
}

var _ outbox.Token = (*token)(nil)

func (t *token) Done() <-chan struct{} { return t.done }
func (t *token) Error() error          { return t.err }

func (t *token) fail(err error) *token {
	t.settle(err)
	return t
}

// settle completes t with err (nil: stored); called once, by whoever
// took t from the connection's in-flight tokens, or before it was put
// there.
func (t *token) settle(err error) {
	t.err = err
	close(t.done)
}

// refusals are the JetStream API errors that refuse the message itself;
// every other one is the stream's state (full, no quorum, out of
// resources): an outage.
var refusals = map[jetstream.ErrorCode]bool{
	jetstream.JSErrCodeStreamMessageExceedsMaximum: true,  // too large for the stream, for good
	jetstream.JSErrCodeStreamWrongLastSequence:     false, // an expectation header, not the relay's
}

// publishFault says whose fault a failed publish to subject was, in the
// terms of outbox.Token.
func publishFault(subject string, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return unavailable(fmt.Errorf("natsjs: no stream captures the subject %q (no responders): %w", subject, err))
	case errors.As(err, &apiErr):
		if permanent, ok := refusals[apiErr.ErrorCode]; ok {
			return &outbox.Refusal{Reason: fmt.Sprintf("natsjs: the stream refused the message: %s", apiErr.Description), Permanent: permanent}
		}
		return unavailable(fmt.Errorf("natsjs: the stream cannot take the message: %w", err))
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, jetstream.ErrTooManyStalledMsgs), errors.Is(err, nats.ErrTimeout):
		return unavailable(fmt.Errorf("natsjs: %w", err))
	}
	return fmt.Errorf("natsjs: %w", err)
}

// unavailable marks err as the broker's state: it matches
// outbox.ErrBrokerUnavailable and reads as err.
func unavailable(err error) error { return &brokerUnavailable{err} }

type brokerUnavailable struct{ err error }

func (e *brokerUnavailable) Error() string        { return e.err.Error() }
func (e *brokerUnavailable) Unwrap() error        { return e.err }
func (e *brokerUnavailable) Is(target error) bool { return target == outbox.ErrBrokerUnavailable }

// percentEncode encodes a header value as the CloudEvents bindings ask
// (HTTP binding 3.1.3.2, which the NATS binding follows): space, '"', '%'
// and every byte outside printable ASCII as %XX of its UTF-8 bytes, so that
// a consumer that decodes gets the value back as it was.
func percentEncode(v string) string {
	const hex = "0123456789ABCDEF"
	n := 0
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c > '~' || c == '"' || c == '%' {
			n++
		}
	}
	if n == 0 {
		return v
	}
	b := make([]byte, 0, len(v)+2*n)
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c > '~' || c == '"' || c == '%' {
			b = append(b, '%', hex[c>>4], hex[c&15])
			continue
		}
		b = append(b, v[i])
	}
	return string(b)
}
