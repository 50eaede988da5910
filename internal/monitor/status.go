package monitor

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/edgeoutbox/outbox"
)

// statusRefresh is how often the page reloads itself (a meta refresh: no
// JavaScript).
const statusRefresh = 10

// maxDeadShown bounds the dead messages the page lists.
const maxDeadShown = 20

type statusData struct {
	Source      string
	Version     string
	HasRelay    bool
	Connected   bool
	Since       string // "16:02:03 UTC, 5m ago"
	Attempts    int64
	Protocol    string
	Ready       string // "" when ready
	Pending     int64
	Oldest      string // its age in words; empty when nothing is pending
	LastError   string
	LastErrorAt string
	// BrokerSays is what the broker says of itself while it says it
	// cannot take messages, with since when: "the broker says quota
	// exceeded (0x97), since 10:02:00 UTC, 3m ago".
	BrokerSays string
	Published  int64
	Dead       []outbox.Record
	DeadCount  int64
	CanRequeue bool
	Notice     string
	Spark      string // an inline SVG, made by sparkline
	Refresh    int
	Now        string
	Err        string

	// NoSubscribers says how many of Published the broker took with no
	// subscriber, and the last topic: "12 reached the broker with no
	// subscriber, last on stores/42/orders at 10:02:03 UTC, 3m ago".
	NoSubscribers string
}

// statusStyle is the page's style sheet (inline: the page loads nothing).
const statusStyle = `<style>
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222;max-width:70rem}
h1{font-size:1.3rem;margin:0 0 1rem} .muted{color:#666;font-size:.9rem}
.state{font-size:1.6rem;font-weight:bold;padding:.6rem 1rem;border-radius:.4rem;display:inline-block}
.up{background:#d9f2dd;color:#14532d} .down{background:#fde2e1;color:#7f1d1d}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(14rem,1fr));gap:1rem;margin:1rem 0}
.card{border:1px solid #ddd;border-radius:.4rem;padding:.7rem 1rem} .big{font-size:1.5rem;font-weight:bold}
table{border-collapse:collapse;width:100%} td,th{border-bottom:1px solid #eee;padding:.3rem .5rem;text-align:left;font-size:.9rem;vertical-align:top}
.notice{background:#fff7d6;padding:.5rem 1rem;border-radius:.4rem} .err{color:#7f1d1d}
</style>`

// escapeHTML escapes text for an element's content or a quoted attribute,
// as html/template does.
var escapeHTML = strings.NewReplacer("\x00", "\uFFFD", `"`, "&#34;", "&", "&amp;", "'", "&#39;", "+", "&#43;", "<", "&lt;", ">", "&gt;").Replace

// writeStatus writes the status page of d. It is written out here rather
// than by html/template: executing a template makes the linker keep every
// exported method of every type in the program (text/template finds
// methods by name), which made the page the heaviest part of a till's
// outboxctl after the library itself. Every string from the outbox, the
// relay or the request goes through escapeHTML.
func writeStatus(w io.Writer, d statusData) error {
	var b strings.Builder
	put := func(parts ...string) {
		for _, p := range parts {
			b.WriteString(p)
		}
	}
	num := func(n int64) string { return strconv.FormatInt(n, 10) }
	title := "status"
	if d.HasRelay {
		title = "NOT connected"
		if d.Connected {
			title = "connected"
		}
	}
	put(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="`, strconv.Itoa(d.Refresh), `">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>outbox: `, title, `, `, num(d.Pending), ` pending</title>
`, statusStyle, `</head><body>
<h1>outbox on `, escapeHTML(d.Source), ` <span class="muted">version `, escapeHTML(d.Version), `, page of `, escapeHTML(d.Now), `, refreshes every `, strconv.Itoa(d.Refresh), ` s</span></h1>
`)
	if d.Notice != "" {
		put(`<p class="notice" id="notice">`, escapeHTML(d.Notice), `</p>`)
	}
	put("\n")
	if d.Err != "" {
		put(`<p class="err" id="error">Cannot read the outbox: `, escapeHTML(d.Err), `</p>`)
	}
	put("\n")
	if d.HasRelay {
		put("\n<p><span id=\"state\" data-connected=\"", strconv.FormatBool(d.Connected), `" class="state `)
		if d.Connected {
			put(`up">Connected to the broker`)
		} else {
			put(`down">NOT connected to the broker`)
		}
		put("</span>\n<span class=\"muted\" id=\"since\">")
		if d.Since != "" {
			put("since ", escapeHTML(d.Since))
		}
		if !d.Connected {
			put("; ", num(d.Attempts), " connection attempts so far")
		}
		put("</span></p>\n<p id=\"mqtt\">MQTT version (of the last connection): <b>")
		if d.Protocol != "" {
			put(escapeHTML(d.Protocol))
		} else {
			put("not known yet")
		}
		put("</b>.\n")
		if d.BrokerSays != "" {
			put(`<span class="err" id="broker-says">`, escapeHTML(d.BrokerSays), `; nothing is charged while it does.</span> `)
		}
		if d.Ready != "" {
			put(`<span class="err" id="ready">Not ready: `, escapeHTML(d.Ready), `</span>`)
		} else {
			put(`<span id="ready">Ready: holds the lease, last database write succeeded.</span>`)
		}
		put("</p>\n")
	} else {
		put(`<p id="state" data-connected="unknown">No relay runs in this process.</p>`)
	}
	put(`
<div class="grid">
<div class="card"><div class="muted">Waiting to be sent</div><div class="big" id="pending">`, num(d.Pending), `</div>
<div class="muted" id="oldest">`)
	if d.Oldest != "" {
		put("oldest waits for ", escapeHTML(d.Oldest))
	} else {
		put("nothing waits")
	}
	put(`</div></div>
<div class="card"><div class="muted">Backlog</div>`, d.Spark, `</div>
<div class="card"><div class="muted">Sent since start</div><div class="big" id="published">`, num(d.Published), `</div>`)
	if d.NoSubscribers != "" {
		put(`<div class="err" id="no-subscribers">`, escapeHTML(d.NoSubscribers), `: they reached nobody. Is the consumer subscribed, is the topic right?</div>`)
	}
	put(`</div>
<div class="card"><div class="muted">Dead messages</div><div class="big" id="dead-count">`, num(d.DeadCount), `</div></div>
</div>
<h2>Last error</h2>
<p id="last-error">`)
	if d.LastError != "" {
		put(escapeHTML(d.LastError), ` <span class="muted">(`, escapeHTML(d.LastErrorAt), `)</span>`)
	} else {
		put("none")
	}
	put("</p>\n<h2>Dead messages</h2>\n")
	if len(d.Dead) > 0 {
		put("<table id=\"dead\"><tr><th>id</th><th>topic</th><th>attempts</th><th>why</th><th>parked</th></tr>\n")
		for _, r := range d.Dead {
			put(`<tr><td>`, escapeHTML(r.ID), `</td><td>`, escapeHTML(r.Topic), `</td><td>`, strconv.Itoa(r.Attempts), `</td><td>`, escapeHTML(r.LastError),
				`</td><td>`, r.DeadAt.UTC().Format("2006-01-02 15:04:05"), " UTC</td></tr>\n")
		}
		put("</table>")
		if d.DeadCount > int64(len(d.Dead)) {
			put(`<p class="muted">and `, num(d.DeadCount), ` in all; outboxctl list --state dead shows every one.</p>`)
		}
		put("\n")
		if d.CanRequeue {
			put(`<form method="post" action="/requeue" id="requeue">
<label>Admin token <input type="password" name="token" autocomplete="off" required></label>
<button type="submit">Requeue every dead message</button></form>
`)
		} else {
			put(`<p class="muted" id="read-only">Read-only: the relay was started without an admin token, so nothing can be requeued here (outboxctl requeue can).</p>`)
		}
		put("\n")
	} else {
		put(`<p id="dead">none</p>`)
	}
	put("\n</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func (m *Monitor) statusPage(w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
	defer cancel()
	now := time.Now()
	d := statusData{Version: m.opts.Version, Refresh: statusRefresh, Now: now.UTC().Format("15:04:05 UTC"), CanRequeue: m.opts.AdminToken != ""}
	if r := m.opts.Relay; r != nil {
		rm := r.Metrics()
		d.HasRelay, d.Connected, d.Protocol, d.Source = true, rm.Connected, rm.Protocol, rm.Source
		d.Attempts, d.Published, d.LastError = rm.ConnectionAttempts, rm.Published, rm.LastError
		if !rm.Since.IsZero() {
			d.Since = rm.Since.UTC().Format("15:04:05 UTC") + ", " + ago(now.Sub(rm.Since)) + " ago"
		}
		if !rm.LastErrorAt.IsZero() {
			d.LastErrorAt = rm.LastErrorAt.UTC().Format("2006-01-02 15:04:05 UTC")
		}
		if rm.BrokerUnavailable != "" {
			d.BrokerSays = rm.BrokerUnavailable + ", since " + rm.BrokerUnavailableSince.UTC().Format("15:04:05 UTC") + ", " + ago(now.Sub(rm.BrokerUnavailableSince)) + " ago"
		}
		if rm.NoSubscribers > 0 {
			d.NoSubscribers = fmt.Sprintf("%d reached the broker with no subscriber, last on %s at %s, %s ago", rm.NoSubscribers, rm.NoSubscribersTopic,
				rm.NoSubscribersAt.UTC().Format("15:04:05 UTC"), ago(now.Sub(rm.NoSubscribersAt)))
		}
		d.Ready = m.notReady()
	}
	if d.Source == "" {
		d.Source = "this device"
	}
	g, err := m.ob.Gauges(ctx)
	if err == nil {
		d.Pending, d.DeadCount = g.Pending, g.Dead
		if !g.OldestPending.IsZero() {
			d.Oldest = ago(now.Sub(g.OldestPending))
		}
		if g.Dead > 0 {
			d.Dead, err = m.ob.List(ctx, outbox.ListOptions{State: outbox.StateDead, Limit: maxDeadShown})
		}
	}
	if err != nil {
		d.Err = err.Error()
	}
	q := req.URL.Query()
	switch {
	case q.Get("requeued") != "":
		n, _ := strconv.Atoi(q.Get("requeued"))
		d.Notice = fmt.Sprintf("Requeued %d dead messages.", n)
	case q.Get("requeue") == "denied":
		d.Notice = "Not requeued: wrong admin token."
	case q.Get("requeue") == "failed":
		d.Notice = "Not requeued: the database refused (see the relay's log)."
	}
	m.mu.Lock()
	pts := append([]sample(nil), m.samples...)
	m.mu.Unlock()
	if err == nil {
		pts = append(pts, sample{at: now, pending: g.Pending})
	}
	d.Spark = sparkline(pts, now)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// The page is for this listener only: no framing by another site.
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	if err := writeStatus(w, d); err != nil {
		m.log.Debug("monitor: writing the status page", "err", err)
	}
}

// sparkline draws the backlog of the last hour as an inline SVG polyline:
// time left to right, the largest backlog at the top.
func sparkline(pts []sample, now time.Time) string {
	const w, h = 240.0, 48.0
	var peak int64
	for _, p := range pts {
		peak = max(peak, p.pending)
	}
	top := max(peak, 1)
	var b strings.Builder
	// An hour, or what there is of it since start-up (10 s at least):
	// a device that just started shows its backlog's shape, not a line at
	// the right edge.
	span := time.Hour
	if len(pts) > 0 {
		span = min(max(now.Sub(pts[0].at), 10*time.Second), time.Hour)
	}
	for i, p := range pts {
		x := w - now.Sub(p.at).Seconds()/span.Seconds()*w
		y := h - float64(p.pending)/float64(top)*(h-2) - 1
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", max(x, 0), y)
	}
	// Every value here is a number this code formatted.
	return fmt.Sprintf(`<svg id="sparkline" xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" role="img" aria-label="backlog over the last hour, at most %d">`+
		`<rect width="%g" height="%g" fill="#f6f6f6"/><polyline fill="none" stroke="#2563eb" stroke-width="2" points="%s"/></svg>`+
		`<div class="muted" id="peak">peak %d over the last %s</div>`, w, h, w, h, peak, w, h, b.String(), peak, ago(span))
}

// ago says a duration in words a technician reads at a glance.
func ago(d time.Duration) string {
	d = max(d, 0)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h %d min", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%d days", int(d.Hours()/24))
}
