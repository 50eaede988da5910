package outboxprom

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestStatusPageInChromium loads the status page in headless Chromium during
// a broker outage and after it, checks what the page shows and saves a
// screenshot of each to the test's directory. The page has no script and its
// Content-Security-Policy allows none: what Chromium shows is what a browser
// with JavaScript off shows. (Chromium's --dump-dom and --screenshot need
// JavaScript themselves, so it cannot be turned off here.)
// OUTBOX_STATUS_SCREENSHOT=FILE also writes the outage's screenshot there
// (README's docs/status-page.png: see "Watching it").
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

	dir := t.TempDir()
	dom := chrome.DumpDOM(r.srv.URL + "/")
	require.Contains(t, dom, `data-connected="false"`)
	require.Contains(t, dom, "NOT connected to the broker")
	require.Regexp(t, regexp.MustCompile(`id="pending">25<`), dom)
	require.Contains(t, dom, "oldest waits for")
	require.Contains(t, dom, "connection refused", "the last error in words")
	require.Contains(t, dom, "0x87 not authorized (topic outside this device's ACL)", "the dead message's reason")
	require.Contains(t, dom, `<svg id="sparkline"`)
	require.Contains(t, dom, "peak 25")
	require.Contains(t, dom, `<form method="post" action="/requeue"`)
	require.Contains(t, dom, `name="token"`)
	require.Contains(t, dom, `http-equiv="refresh"`)
	require.NotContains(t, dom, "<script")
	resp, err := http.Get(r.srv.URL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'", "no script may run on the page")
	outage := filepath.Join(dir, "status-outage.png")
	chrome.Screenshot(r.srv.URL+"/", outage)
	if keep := os.Getenv("OUTBOX_STATUS_SCREENSHOT"); keep != "" {
		b, err := os.ReadFile(outage)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(keep, b, 0o644))
	}

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
	require.Contains(t, dom, `MQTT version (of the last connection): <b>5</b>`)
	require.Regexp(t, regexp.MustCompile(`id="published">25<`), dom)
	chrome.Screenshot(r.srv.URL+"/", filepath.Join(dir, "status-after.png"))
	t.Logf("screenshots in %s", dir)
}
