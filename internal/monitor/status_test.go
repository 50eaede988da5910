package monitor

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestStatusPageEscapes: every string the page shows comes from the outbox,
// the relay, a broker or the request, and none of it can add markup.
func TestStatusPageEscapes(t *testing.T) {
	const evil = `<i>"x'&+`
	d := statusData{
		Source: evil, Version: evil, HasRelay: true, Since: evil, Protocol: evil, Role: evil,
		Pending: 1, Oldest: evil, Priorities: []string{evil}, LastError: evil, LastErrorAt: evil, Fault: fault{evil, evil}, BrokerSays: evil, NoSubscribers: evil, DeadCount: 2, Notice: evil, Now: evil, Err: evil,
		Dead:    []outbox.Record{{ID: evil, Topic: evil, LastError: evil}},
		Expired: []outbox.Record{{ID: evil, Topic: evil, LastError: evil}}, ExpiredCount: 1,
	}
	var b strings.Builder
	require.NoError(t, writeStatus(&b, d))
	page := b.String()
	require.NotContains(t, page, "<i>")
	require.Equal(t, 22, strings.Count(page, "&lt;i&gt;&#34;x&#39;&amp;&#43;"), "every field shown, escaped:\n%s", page)
}

// TestSparklineFlat: a backlog that did not move reads as such, in words
// and drawn at mid-height, not as a line along an edge; one that moved
// says from what to what.
func TestSparklineFlat(t *testing.T) {
	now := time.Now()
	pts := func(vals ...int64) []sample {
		var s []sample
		for i, v := range vals {
			s = append(s, sample{at: now.Add(time.Duration(i-len(vals)+1) * time.Minute), pending: v})
		}
		return s
	}
	for _, c := range []struct {
		vals  []int64
		label string
		y     string // of every point
	}{
		{[]int64{25, 25, 25, 25}, "steady at 25 over the last 3 min 0 s", "24.0"},
		{[]int64{0, 0, 0}, "steady at 0 over the last 2 min 0 s", "24.0"},
		{[]int64{0, 10, 25, 5}, "from 0 to 25 over the last 3 min 0 s, now 5", ""},
	} {
		svg := sparkline(pts(c.vals...), now)
		require.Contains(t, svg, c.label, svg)
		points := regexp.MustCompile(`points="([^"]*)"`).FindStringSubmatch(svg)
		require.Len(t, points, 2, svg)
		ys := map[string]bool{}
		for _, p := range strings.Fields(points[1]) {
			ys[p[strings.IndexByte(p, ',')+1:]] = true
		}
		if c.y != "" {
			require.Equal(t, map[string]bool{c.y: true}, ys, "a flat backlog at mid-height: %s", svg)
		} else {
			require.Len(t, ys, len(c.vals), "a moving backlog has its shape: %s", svg)
		}
	}
	require.Contains(t, sparkline(nil, now), "no backlog figures yet")
}

// pageState is one state the status page can show, and what it must say
// in it.
type pageState struct {
	name string
	doc  bool // one of README's pictures
	rd   readings
	says []string
	not  []string
}

// pageStates are the states a technician may find the page in, each made
// of the figures a relay in it reports (RelayMetrics, Gauges, the parked
// messages), its last error made by the real code where that is cheap.
func pageStates(t *testing.T) []pageState {
	now := time.Date(2026, 12, 4, 16, 2, 3, 0, time.UTC)
	ca := harness.NewCA(t, "fleet-ca")
	server := ca.ServerCertificate(t)
	free := harness.StartFakeBroker(t, harness.FakeBrokerOptions{})
	closed := free.URL()
	free.Close()
	refused := connectErr(t, outbox.MQTTOptions{Broker: closed})
	tlsErr := connectErr(t, outbox.MQTTOptions{Broker: tlsBroker(t, &tls.Config{Certificates: []tls.Certificate{server}}), TLSConfig: &tls.Config{}})
	authErr := connectErr(t, outbox.MQTTOptions{Broker: connack(t, 0x86, 4), Protocol: outbox.Protocol5})
	quotaErr := connectErr(t, outbox.MQTTOptions{Broker: connack(t, 0x97, 3), Protocol: outbox.Protocol5})
	diskErr := fmt.Errorf("outbox: relay: mark sent: %w: database or disk is full (13)", outbox.ErrDiskFull)

	up := outbox.RelayMetrics{Running: true, Connected: true, HoldsLease: true, LastWriteOK: true, Protocol: "5",
		Since: now.Add(-24 * time.Second), Published: 1234, Source: "/stores/42/tills/7"}
	down := func(err error) *outbox.RelayMetrics {
		m := up
		m.Connected, m.Since, m.AttemptsSince, m.ConnectionAttempts = false, now.Add(-22*time.Second), 12, 31
		m.LastErr, m.LastError, m.LastErrorAt = err, err.Error(), now.Add(-2*time.Second)
		return &m
	}
	with := func(m outbox.RelayMetrics, f func(*outbox.RelayMetrics)) *outbox.RelayMetrics { f(&m); return &m }
	backlog := outbox.Gauges{Pending: 25, OldestPending: now.Add(-21 * time.Second)}
	// The same backlog, with alarms at priority 9 among the sales at 0.
	prioritized := backlog
	prioritized.Priorities = []outbox.PriorityStats{
		{Priority: 9, Pending: 3, OldestPending: now.Add(-2 * time.Second)}, {Priority: 0, Pending: 22, OldestPending: now.Add(-21 * time.Second)},
	}
	// The backlog of an outage that ended 24 s ago, draining.
	var draining []sample
	for i, v := range []int64{0, 3, 8, 14, 20, 25, 12, 6} {
		draining = append(draining, sample{at: now.Add(time.Duration(i-7) * 30 * time.Second), pending: v})
	}
	var steady []sample
	for i := range 8 {
		steady = append(steady, sample{at: now.Add(time.Duration(i-7) * 30 * time.Second), pending: 25})
	}
	parked := func(n int, why string) []outbox.Record {
		var rs []outbox.Record
		for i := range n {
			rs = append(rs, outbox.Record{ID: fmt.Sprintf("01JEXAMPLE%016d", i+1), Topic: "stores/42/refunds", Attempts: 5, LastError: why, DeadAt: now.Add(-time.Hour)})
		}
		return rs
	}
	return []pageState{
		{name: "connected", doc: true, rd: readings{Relay: &up, Gauges: outbox.Gauges{Pending: 6, OldestPending: now.Add(-4 * time.Second)}, Samples: draining},
			says: []string{"Connected to the broker", "since 16:01:39 UTC, 24 s ago", "This relay is the one that sends this device&#39;s events; its last save to the disk worked.",
				`id="pending">6<`, "oldest waits for 4 s", "from 0 to 25 over the last 3 min 30 s, now 6", `id="last-error">none`},
			not: []string{"attempts to connect", `action="/reconnect"`}},
		{name: "broker-away", doc: true, rd: readings{Relay: down(refused), Gauges: backlog, Samples: steady, Admin: true},
			says: []string{"NOT connected to the broker", "since 16:01:41 UTC, 22 s ago; 12 attempts to connect since then",
				"Nothing answers at 127.0.0.1:", "Is the broker running? Is its address right (--broker)?",
				`<details id="raw-error"><summary>`, "connect: connection refused", `action="/reconnect"`, "Try to connect now", "steady at 25 over the last 3 min 30 s"}},
		{name: "tls-refused", rd: readings{Relay: down(tlsErr), Gauges: prioritized},
			says: []string{"not signed by an authority this device trusts", "--ca-file", "x509: certificate signed by unknown authority",
				`id="pending">25<`, "oldest waits for 21 s", `id="priorities">priority 9: 3 pending, oldest 2 s<br>priority 0: 22 pending, oldest 21 s</div>`},
			not: []string{`action="/reconnect"`}},
		{name: "auth-refused", rd: readings{Relay: down(authErr), Gauges: backlog},
			says: []string{"The broker refused the user name or password.", "--password-file", "CONNACK 0x86"}},
		{name: "disk-full", rd: readings{Relay: with(up, func(m *outbox.RelayMetrics) {
			m.LastWriteOK, m.LastErr, m.LastError, m.LastErrorAt = false, diskErr, diskErr.Error(), now.Add(-5*time.Second)
		}), Gauges: backlog},
			says: []string{`class="err" id="role">This relay is the one that sends this device&#39;s events, but its last save to the disk failed`,
				"The device&#39;s disk is full", "Free space on the disk that holds the database"}},
		{name: "lease-elsewhere", rd: readings{Relay: with(up, func(m *outbox.RelayMetrics) {
			m.HoldsLease, m.Connected, m.Published, m.Protocol = false, false, 0, ""
			m.Since = now.Add(-10 * time.Minute)
		}), Gauges: backlog},
			says: []string{`class="err" id="role">Another relay on this device is sending its events`, "stands by", "Protocol (of the last connection): <b>not known yet"},
			not:  []string{"attempts to connect", `action="/reconnect"`}},
		{name: "dead-messages", rd: readings{Relay: &up, Gauges: outbox.Gauges{Dead: 23}, Dead: parked(maxDeadShown, "not authorized (0x87)"), Admin: true},
			says: []string{`id="dead-count">23<`, "not authorized (0x87)", "and more: 23 in all; outboxctl list --state dead", `action="/requeue"`},
			not:  []string{"Expired messages"}},
		{name: "expired-messages", rd: readings{Relay: &up, Gauges: outbox.Gauges{Dead: 2}, Expired: parked(2, "expired before its turn"), ExpiredCount: 2},
			says: []string{`id="dead-count">0<`, "<h2>Expired messages</h2>", "expired before its turn", "outboxctl requeue --all-expired", `<p id="dead">none</p>`}},
		{name: "broker-unavailable", rd: readings{Relay: with(up, func(m *outbox.RelayMetrics) {
			m.BrokerUnavailable, m.BrokerUnavailableSince = quotaErr.Error(), now.Add(-3*time.Minute)
			m.LastErr, m.LastError, m.LastErrorAt = quotaErr, quotaErr.Error(), now.Add(-time.Second)
		}), Gauges: backlog},
			says: []string{`id="broker-says">`, "The broker says it cannot take messages for now: quota exceeded (0x97); since 15:59:03 UTC, 3 min 0 s ago", "The broker&#39;s operator is needed",
				"says it cannot take messages for now"}},
	}
}

// TestStatusPageStates renders the page in every state it can show and
// checks what it says; with Chromium installed, it loads them all in
// headless Chromium, side by side on one sheet (one Chromium run: a second
// or two), and screenshots it into the test's directory.
// OUTBOX_STATUS_SCREENSHOTS=DIR also writes README's two pictures there,
// each state alone (docs/status-connected.png, docs/status-broker-away.png;
// see "Watching it").
func TestStatusPageStates(t *testing.T) {
	now := time.Date(2026, 12, 4, 16, 2, 3, 0, time.UTC)
	var chrome *harness.Chromium
	if harness.ChromiumBinary() != "" {
		chrome = harness.NewChromium(t)
	} else {
		t.Log("chromium is not installed (apt-get install -y chromium): the pages are checked, not loaded in a browser")
	}
	dir := t.TempDir()
	docs := os.Getenv("OUTBOX_STATUS_SCREENSHOTS")
	// The sheet: each state's page in a frame of its own, shrunk to a
	// third, three by three in Chromium's 1200x900 window.
	var sheet strings.Builder
	sheet.WriteString(`<!DOCTYPE html><html><head><meta charset="utf-8"><style>` +
		`body{margin:4px;display:grid;grid-template-columns:repeat(3,390px);gap:6px}` +
		`div{overflow:hidden;width:390px;height:292px;border:1px solid #999}` +
		`iframe{width:1200px;height:900px;border:0;transform:scale(.325);transform-origin:0 0}</style></head><body>`)
	for _, s := range pageStates(t) {
		t.Run(s.name, func(t *testing.T) {
			s.rd.Now, s.rd.Version = now, "v0.9.0"
			if s.rd.Samples == nil {
				s.rd.Samples = []sample{{at: now, pending: s.rd.Gauges.Pending}}
			}
			var b strings.Builder
			require.NoError(t, writeStatus(&b, s.rd.page()))
			page := b.String()
			for _, want := range s.says {
				require.Contains(t, page, want)
			}
			for _, not := range s.not {
				require.NotContains(t, page, not)
			}
			sheet.WriteString(`<div id="` + s.name + `"><iframe srcdoc="` + escapeHTML(page) + `"></iframe></div>`)
			if chrome == nil || docs == "" || !s.doc {
				return
			}
			html := filepath.Join(dir, s.name+".html")
			require.NoError(t, os.WriteFile(html, []byte(page), 0o600))
			chrome.Screenshot("file://"+html, filepath.Join(docs, "status-"+s.name+".png"))
		})
	}
	if chrome == nil {
		return
	}
	sheet.WriteString(`</body></html>`)
	html := filepath.Join(dir, "states.html")
	require.NoError(t, os.WriteFile(html, []byte(sheet.String()), 0o600))
	png := filepath.Join(dir, "status-states.png")
	chrome.Screenshot("file://"+html, png)
	t.Logf("every state, side by side: %s", png)
}
