package outboxprom

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestStatusPageInChromium loads the status page of a real relay in
// headless Chromium during a broker outage and after it, and checks what
// the page shows. The page has no script and its Content-Security-Policy
// allows none: what Chromium shows is what a browser with JavaScript off
// shows. (Chromium's --dump-dom needs JavaScript itself, so it cannot be
// turned off here.) internal/monitor's TestStatusPageStates screenshots
// every state the page can show, README's pictures among them.
func TestStatusPageInChromium(t *testing.T) {
	if harness.ChromiumBinary() == "" {
		t.Skip("chromium is not installed: apt-get install -y chromium")
	}
	chrome := harness.NewChromium(t)
	r := startRig(t, rigOptions{exporter: Options{AdminToken: "s3cret", SampleInterval: 100 * time.Millisecond}})
	harness.Eventually(t, 10*time.Second, "connected", func() bool { return r.relay.Metrics().Connected })
	r.proxy.Down()
	harness.Eventually(t, 10*time.Second, "disconnected", func() bool { return !r.relay.Metrics().Connected })
	const n = 25
	for range 5 {
		r.commit(t, n/5)
		// A sample of each step, for the sparkline's shape.
		before := r.exp.mon.SampleCount()
		harness.Eventually(t, 5*time.Second, "a backlog sample", func() bool { return r.exp.mon.SampleCount() > before+1 })
	}
	deadOne(t, r.ob, "the broker refused it: 0x87 not authorized (topic outside this device's ACL)")
	harness.Eventually(t, 10*time.Second, "a connection attempt failed", func() bool {
		return strings.Contains(r.relay.Metrics().LastError, "refused")
	})

	dom := chrome.DumpDOM(r.srv.URL + "/")
	require.Contains(t, dom, `data-connected="false"`)
	require.Contains(t, dom, "NOT connected to the broker")
	require.Regexp(t, regexp.MustCompile(`id="pending">25<`), dom)
	require.Contains(t, dom, "oldest waits for")
	require.Contains(t, dom, "Nothing answers at "+r.proxy.Addr()+": the broker is not running there.", "the last error in words")
	require.Contains(t, dom, "Is the broker running? Is its address right (--broker)?", "what to check")
	require.Contains(t, dom, "connection refused", "the error's own text, one click away")
	require.Regexp(t, regexp.MustCompile(`; [1-9][0-9]* attempts to connect since then`), dom)
	require.Contains(t, dom, `<form method="post" action="/reconnect"`)
	require.Contains(t, dom, "This relay is the one that sends this device's events; its last save to the disk worked.")
	require.Contains(t, dom, "0x87 not authorized (topic outside this device's ACL)", "the dead message's reason")
	require.Contains(t, dom, `<svg id="sparkline"`)
	require.Contains(t, dom, "from 0 to 25 over the last")
	require.Contains(t, dom, `<form method="post" action="/requeue"`)
	require.Contains(t, dom, `name="token"`)
	require.Contains(t, dom, `http-equiv="refresh"`)
	require.NotContains(t, dom, "<script")
	resp, err := http.Get(r.srv.URL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'", "no script may run on the page")

	require.NoError(t, r.proxy.Up())
	harness.Eventually(t, 15*time.Second, "drained", func() bool {
		m := r.relay.Metrics()
		return m.Connected && m.Published == n
	})
	dom = chrome.DumpDOM(r.srv.URL + "/")
	require.Contains(t, dom, `data-connected="true"`)
	require.Contains(t, dom, "Connected to the broker")
	require.Regexp(t, regexp.MustCompile(`id="pending">0<`), dom)
	require.Contains(t, dom, "nothing waits")
	require.Contains(t, dom, `Protocol (of the last connection): <b>MQTT 5</b>`)
	require.Regexp(t, regexp.MustCompile(`id="published">25<`), dom)
	require.NotContains(t, dom, `action="/reconnect"`, "connected: nothing to try")
}
