package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrCredentialsInURL is why a broker URL with a user name or password in
// it is refused.
var ErrCredentialsInURL = errors.New("credentials in a broker URL are not used: give them as Username and Password (outboxctl: --username and --password-file)")

// ParseURL checks a broker URL: scheme tcp, mqtt, ssl, tls or mqtts, a
// host and a port from 1 to 65535, and nothing else (no user, path, query
// or fragment). A client checks its URLs once, at start: what is wrong
// with one is said there, with what a good one looks like, instead of
// being retried for ever.
func ParseURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, fmt.Errorf("outbox: broker URL is empty; %s", urlExample)
	}
	if !strings.Contains(s, "://") {
		// "127.0.0.1:1883" fails url.Parse ("first path segment in URL
		// cannot contain colon") and "localhost:1883" parses with the
		// scheme "localhost": both are a host and port without a scheme.
		if strings.Contains(s, "@") {
			// Not quoted: what is before the @ may be a password.
			return nil, fmt.Errorf("outbox: broker URL has no scheme; %s", urlExample)
		}
		return nil, fmt.Errorf("outbox: broker URL %q has no scheme: write tcp://%s (or ssl://%s for TLS)", s, s, s)
	}
	u, err := url.Parse(s)
	if err != nil {
		// Not err itself: url.Error quotes the whole text, and a password
		// in it with it.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("outbox: broker URL: %w; %s", err, urlExample)
	}
	if u.User != nil {
		// CONNECT takes its user name and password from the options, never
		// from the URL: one given there would be ignored, and the broker's
		// refusal (not authorized) retried for ever. Refused rather than
		// used, so that no password sits in a process list or a log.
		return nil, fmt.Errorf("outbox: broker URL %q: %w", Redact(u), ErrCredentialsInURL)
	}
	switch strings.ToLower(u.Scheme) {
	case "tcp", "mqtt", "ssl", "tls", "mqtts":
	default:
		return nil, fmt.Errorf("outbox: broker URL %q: scheme %q: want tcp or mqtt (plain), or ssl, tls or mqtts (TLS); %s", Redact(u), u.Scheme, urlExample)
	}
	switch {
	case u.Hostname() == "":
		return nil, fmt.Errorf("outbox: broker URL %q has no host; %s", Redact(u), urlExample)
	case u.Port() == "":
		return nil, fmt.Errorf("outbox: broker URL %q has no port: write %s://%s:1883 (8883 for TLS, or the broker's port)", Redact(u), u.Scheme, u.Host)
	}
	if p, err := strconv.Atoi(u.Port()); err != nil || p < 1 || p > 65535 {
		return nil, fmt.Errorf("outbox: broker URL %q: port %s is not 1 to 65535; %s", Redact(u), u.Port(), urlExample)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		// MQTT has no use for them: the topic is the message's, not the
		// URL's. Silently dropped, a path would look like it chose one.
		return nil, fmt.Errorf("outbox: broker URL %q: MQTT takes no path, query or fragment: write %s://%s", Redact(u), u.Scheme, u.Host)
	}
	return u, nil
}

// urlExample says what a good broker URL looks like.
const urlExample = "want SCHEME://HOST:PORT, e.g. tcp://127.0.0.1:1883 or ssl://broker.example.com:8883"

// ParseBrokers checks a client's broker addresses, given as one (broker)
// or several (brokers, a cluster's nodes), and parses them in order; what
// names the client in errors.
func ParseBrokers(what, broker string, brokers []string) ([]*url.URL, error) {
	addrs := brokers
	switch {
	case broker != "" && len(brokers) > 0:
		return nil, fmt.Errorf("outbox: %s: set Broker or Brokers, not both", what)
	case broker != "":
		addrs = []string{broker}
	case len(addrs) == 0:
		addrs = []string{""} // ParseURL says what is missing
	}
	urls := make([]*url.URL, 0, len(addrs))
	for _, a := range addrs {
		u, err := ParseURL(a)
		if err != nil {
			return nil, err
		}
		urls = append(urls, u)
	}
	return urls, nil
}

// IsTLS reports whether u asks for TLS (ssl, tls or mqtts).
func IsTLS(u *url.URL) bool {
	switch strings.ToLower(u.Scheme) {
	case "ssl", "tls", "mqtts":
		return true
	}
	return false
}

// Redact is u as text, with any password left out: for logs and stats.
func Redact(u *url.URL) string {
	if u.User == nil {
		return u.String()
	}
	c := *u
	c.User = url.User("REDACTED")
	return c.String()
}

// FirstBroker is the index, among n addresses, of the one a client with
// this id tries first: FNV-1a of the id, so that a fleet starts spread over
// a cluster's nodes instead of all on the first, and one device (or
// consumer) always starts on the same node.
func FirstBroker(clientID string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(clientID); i++ {
		h = (h ^ uint32(clientID[i])) * 16777619
	}
	return int(h % uint32(n))
}

// Version is the MQTT version a client speaks.
type Version int

// The versions a client may be asked to speak.
const (
	// Auto speaks 5 and falls back to 3.1.1 for a broker without 5 (see
	// Brokers.Connect).
	Auto Version = iota
	// V5 speaks MQTT 5 only.
	V5
	// V311 speaks MQTT 3.1.1 only.
	V311
)

// Brokers is one client's broker addresses, the publisher's or a
// subscriber's: which one the next connection tries (each after the first
// moves to the next, in order, from the last back to the first), and what
// Auto learnt of each. It is safe for concurrent use.
type Brokers struct {
	log    *slog.Logger
	prefix string
	now    func() time.Time // time.Now; tests move it on

	mu   sync.Mutex
	urls []*url.URL
	mem  []memory // per address
	next int      // the address the next connection tries
	at   int      // the address of the last one
}

// NewBrokers returns the list of urls (not empty) for a client with this
// id, which starts on FirstBroker's address. The fallbacks of Auto are
// logged on log, their message after prefix.
func NewBrokers(urls []*url.URL, clientID string, log *slog.Logger, prefix string) *Brokers {
	first := FirstBroker(clientID, len(urls))
	return &Brokers{log: log, prefix: prefix, now: time.Now, urls: urls, mem: make([]memory, len(urls)), next: first, at: first}
}

// Current is the address of the last connection, the one in use while
// connected; before any, the first to be tried.
func (b *Brokers) Current() *url.URL {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.urls[b.at]
}

// Attempt is one connection attempt: the address and the version.
type Attempt struct {
	// URL is the broker's address.
	URL *url.URL
	// V5 says the attempt speaks MQTT 5; else 3.1.1.
	V5 bool

	b *Brokers
	m *memory
}

// Connected records that the attempt's connection is up. One over 5 tells
// Auto that the address speaks 5: the count of closes without a CONNACK
// starts again.
func (a *Attempt) Connected() {
	if a.V5 && a.b != nil {
		a.b.mu.Lock()
		a.m.learn(nil, a.b.now())
		a.b.mu.Unlock()
	}
}

// Connect makes one connection attempt to the next address, in version v,
// with open, and returns what open returned. open calls Attempt.Connected
// once its connection is up; a subscriber's open returns only when its
// session ends.
//
// Auto is the one rule of the fallback from 5 to 3.1.1, for the publisher
// and the subscriber alike: it speaks 5, and 3.1.1 at once to a broker whose
// CONNACK said it does not speak 5 (for the client's life), or that closed
// two MQTT 5 CONNECTs in a row without a CONNACK (for retry5After: it may
// have been an outage). An attempt that ctx ended teaches it nothing.
func (b *Brokers) Connect(ctx context.Context, v Version, open func(context.Context, *Attempt) error) error {
	b.mu.Lock()
	b.at = b.next
	b.next = (b.next + 1) % len(b.urls)
	a := &Attempt{URL: b.urls[b.at], V5: v != V311, b: b, m: &b.mem[b.at]}
	if v == Auto && a.m.use311(b.now()) {
		a.V5 = false
	}
	b.mu.Unlock()
	err := open(ctx, a)
	if v != Auto || !a.V5 || ctx.Err() != nil {
		return err
	}
	b.mu.Lock()
	fallback := a.m.learn(err, b.now())
	b.mu.Unlock()
	if fallback == "" {
		return err
	}
	b.log.Info(b.prefix+fallback, "broker", Redact(a.URL), "err", err)
	return open(ctx, &Attempt{URL: a.URL, b: b, m: a.m})
}

// retry5After is how long Auto speaks 3.1.1 after two bare closes before it
// tries 5 again: the closes may have been an outage, not a broker without 5.
const retry5After = 10 * time.Minute

// memory is what Auto learnt of one address: no5 once its CONNACK said it
// does not speak 5; bareCloses counts 5 CONNECTs in a row that it closed
// without a CONNACK, and after two, 3.1.1 is spoken until retry5At.
type memory struct {
	no5        bool
	bareCloses int
	retry5At   time.Time
}

// use311 reports whether Auto speaks 3.1.1 to this address now.
func (m *memory) use311(now time.Time) bool { return m.no5 || now.Before(m.retry5At) }

// learn records how an MQTT 5 connection attempt ended (nil: it is up). It
// returns why Auto falls back to 3.1.1 now, for the log, or "" to stay on
// 5.
func (m *memory) learn(err error, now time.Time) (fallback string) {
	switch {
	case err == nil:
		m.bareCloses = 0
	case errors.Is(err, ErrUnsupportedVersion):
		m.no5 = true
		return "the broker does not speak MQTT 5; speaking 3.1.1 from now on"
	case errors.Is(err, ErrClosedAfterConnect):
		m.bareCloses++
		if m.bareCloses >= 2 {
			m.bareCloses = 0
			m.retry5At = now.Add(retry5After)
			return "the broker closed two MQTT 5 CONNECTs in a row without a CONNACK; speaking 3.1.1, trying 5 again in " + retry5After.String()
		}
	}
	return ""
}
