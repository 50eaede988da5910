package monitor

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/edgeoutbox/outbox/internal/metrics"

	"github.com/edgeoutbox/outbox"
)

// statusRefresh is how often the page reloads itself (a meta refresh: no
// JavaScript).
const statusRefresh = 10

// maxDeadShown bounds the dead messages the page lists.
const maxDeadShown = 20

type statusData struct {
	Source    string
	Version   string
	HasRelay  bool
	Connected bool
	Since     string // "16:02:03 UTC, 5m ago"
	// Trying: the relay holds the lease and is not connected, so it tries
	// to connect; Attempts counts its tries since Since, this outage's.
	Trying   bool
	Attempts int64
	Protocol string
	// Role says what this process does with the device's events, in
	// words; RoleOK whether that is as it should be.
	Role    string
	RoleOK  bool
	Pending int64
	Oldest  string // its age in words; empty when nothing is pending
	// Priorities say what waits at each priority that has any, highest
	// first: "priority 9: 3 pending, oldest 2 s".
	Priorities  []string
	LastError   string // the error's own text, behind a click
	LastErrorAt string
	Fault       fault // the last error in words, with what to check
	// BrokerSays is what the broker says of itself while it says it
	// cannot take messages, with since when: "The broker says it cannot
	// take messages for now: quota exceeded (0x97); since 10:02:00 UTC,
	// 3 min 0 s ago".
	BrokerSays string
	Published  int64
	Dead       []outbox.Record
	DeadCount  int64
	// Expired are the messages whose time to live ran out before they
	// were sent (parked, as dead ones are, but not requeued with them).
	Expired      []outbox.Record
	ExpiredCount int64
	// Admin: an admin token is set, so the page has its buttons
	// (requeue, try to connect now).
	Admin   bool
	Notice  string
	Spark   string // an inline SVG, made by sparkline
	Refresh int
	Now     string
	Err     string
	// Commands counts the commands received from the backend by state,
	// "2 waiting, 140 applied, 1 expired, 0 failed, 0 malformed"; empty
	// when there are none.
	Commands string
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
.notice{background:#fff7d6;padding:.5rem 1rem;border-radius:.4rem} .err{color:#7f1d1d} .ok{color:#14532d}
.hint{margin:.3rem 0} details{margin:.3rem 0} code{font-size:.85rem;word-break:break-all} form{margin:.5rem 0}
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
		if d.Trying && d.Since != "" {
			put("; ", num(d.Attempts), " attempts to connect since then")
		}
		put("</span></p>\n")
		if d.Trying && d.Admin {
			put(`<form method="post" action="/reconnect" id="reconnect">
<label>Admin token <input type="password" name="token" autocomplete="off" required></label>
<button type="submit">Try to connect now</button> <span class="muted">rather than at the relay's next attempt</span></form>
`)
		}
		put("<p id=\"protocol\">Protocol (of the last connection): <b>")
		if d.Protocol != "" {
			put(escapeHTML(metrics.ProtocolName(d.Protocol)))
		} else {
			put("not known yet")
		}
		put("</b>.</p>\n")
		if d.BrokerSays != "" {
			put(`<p class="err" id="broker-says">`, escapeHTML(d.BrokerSays),
				`.<br><b>The broker's operator is needed</b>: nothing is wrong on this device, the events wait here and nothing is charged against them.</p>`, "\n")
		}
		class := "err"
		if d.RoleOK {
			class = "ok"
		}
		put(`<p class="`, class, `" id="role">`, escapeHTML(d.Role), "</p>\n")
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
	put(`</div>`)
	if len(d.Priorities) > 0 {
		put(`<div class="muted" id="priorities">`)
		for i, p := range d.Priorities {
			if i > 0 {
				put("<br>")
			}
			put(escapeHTML(p))
		}
		put(`</div>`)
	}
	put(`</div>
<div class="card"><div class="muted">Backlog</div>`, d.Spark, `</div>
<div class="card"><div class="muted">Sent since start</div><div class="big" id="published">`, num(d.Published), `</div>`)
	if d.NoSubscribers != "" {
		put(`<div class="err" id="no-subscribers">`, escapeHTML(d.NoSubscribers), `: they reached nobody. Is the consumer subscribed, is the topic right?</div>`)
	}
	put(`</div>
<div class="card"><div class="muted">Dead messages</div><div class="big" id="dead-count">`, num(d.DeadCount), `</div></div>`)
	if d.Commands != "" {
		put("\n", `<div class="card"><div class="muted">Commands from the backend</div><div id="commands">`, escapeHTML(d.Commands), `</div></div>`)
	}
	put(`
</div>
<h2>Last error</h2>
`)
	if d.LastError != "" {
		put(`<p id="last-error"><b id="fault">`, escapeHTML(d.Fault.Words), `</b> <span class="muted">(`, escapeHTML(d.LastErrorAt), `)</span></p>
<p class="hint" id="hint">`, escapeHTML(d.Fault.Hint), `</p>
<details id="raw-error"><summary>The error as the program reported it</summary><code>`, escapeHTML(d.LastError), `</code></details>`)
	} else {
		put(`<p id="last-error">none</p>`)
	}
	put("\n<h2>Dead messages</h2>\n")
	if len(d.Dead) > 0 {
		writeParked(put, "dead", d.Dead, d.DeadCount, "dead")
		if d.Admin {
			put(`<form method="post" action="/requeue" id="requeue">
<label>Admin token <input type="password" name="token" autocomplete="off" required></label>
<button type="submit">Requeue every dead message</button></form>
`)
		} else {
			put(`<p class="muted" id="read-only">Read-only: the relay was started without an admin token, so nothing can be requeued or retried here (outboxctl requeue can).</p>`)
		}
		put("\n")
	} else {
		put(`<p id="dead">none</p>`)
	}
	if len(d.Expired) > 0 {
		put("\n<h2>Expired messages</h2>\n<p>Their time to live ran out before they could be sent, so they were not.",
			" <span class=\"muted\">outboxctl requeue --all-expired sends them after all, however late.</span></p>\n")
		writeParked(put, "expired", d.Expired, d.ExpiredCount, "expired")
	}
	put("\n</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// writeParked writes a table of parked messages, the first of count.
func writeParked(put func(...string), id string, rs []outbox.Record, count int64, state string) {
	put(`<table id="`, id, `"><tr><th>id</th><th>topic</th><th>attempts</th><th>why</th><th>parked</th></tr>`, "\n")
	for _, r := range rs {
		put(`<tr><td>`, escapeHTML(r.ID), `</td><td>`, escapeHTML(r.Topic), `</td><td>`, strconv.Itoa(r.Attempts), `</td><td>`, escapeHTML(r.LastError),
			`</td><td>`, r.DeadAt.UTC().Format("2006-01-02 15:04:05"), " UTC</td></tr>\n")
	}
	put("</table>")
	if count > int64(len(rs)) {
		put(`<p class="muted">and more: `, strconv.FormatInt(count, 10), ` in all; outboxctl list --state `, state, ` shows every one.</p>`)
	}
	put("\n")
}

// readings are what the page shows, read at one instant; page turns them
// into words. Tests give it states no real relay is cheap to put in.
type readings struct {
	Now     time.Time
	Version string
	Admin   bool
	Relay   *outbox.RelayMetrics // nil: no relay in this process
	Gauges  outbox.Gauges
	Dead    []outbox.Record
	Expired []outbox.Record
	// ExpiredCount is how many of Gauges.Dead are expired.
	ExpiredCount int64
	Err          error // reading the outbox failed
	Samples      []sample
	Query        url.Values
}

func (m *Monitor) statusPage(w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
	defer cancel()
	rd := readings{Now: time.Now(), Version: m.opts.Version, Admin: m.opts.AdminToken != "", Query: req.URL.Query()}
	if r := m.opts.Relay; r != nil {
		rm := r.Metrics()
		rd.Relay = &rm
	}
	rd.Gauges, rd.Err = m.ob.Gauges(ctx)
	if rd.Err == nil && rd.Gauges.Dead > 0 {
		rd.Dead, rd.Expired, rd.ExpiredCount, rd.Err = m.parked(ctx)
	}
	m.mu.Lock()
	rd.Samples = append([]sample(nil), m.samples...)
	m.mu.Unlock()
	if rd.Err == nil {
		rd.Samples = append(rd.Samples, sample{at: rd.Now, pending: rd.Gauges.Pending})
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// The page is for this listener only: no framing by another site.
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	if err := writeStatus(w, rd.page()); err != nil {
		m.log.Debug("monitor: writing the status page", "err", err)
	}
}

// parked lists the first dead and expired messages, and counts the
// expired ones (Gauges counts both as dead) as Stats does, through the
// index of parked rows.
func (m *Monitor) parked(ctx context.Context) (dead, expired []outbox.Record, nExpired int64, err error) {
	dead, err = m.ob.List(ctx, outbox.ListOptions{State: outbox.StateDead, Limit: maxDeadShown})
	if err != nil {
		return nil, nil, 0, err
	}
	expired, err = m.ob.List(ctx, outbox.ListOptions{State: outbox.StateExpired, Limit: maxDeadShown})
	if err != nil || len(expired) < maxDeadShown {
		return dead, expired, int64(len(expired)), err
	}
	err = m.ob.DB().QueryRowContext(ctx, `SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL AND expired`).Scan(&nExpired)
	return dead, expired, nExpired, err
}

// page says the readings in words.
func (rd readings) page() statusData {
	now := rd.Now
	d := statusData{Version: rd.Version, Refresh: statusRefresh, Now: now.UTC().Format("15:04:05 UTC"), Admin: rd.Admin, Source: "this device"}
	if rm := rd.Relay; rm != nil {
		d.HasRelay, d.Connected, d.Protocol = true, rm.Connected, rm.Protocol
		if rm.Source != "" {
			d.Source = rm.Source
		}
		d.Attempts, d.Published, d.LastError = rm.AttemptsSince, rm.Published, rm.LastError
		if !rm.Since.IsZero() {
			d.Since = rm.Since.UTC().Format("15:04:05 UTC") + ", " + ago(now.Sub(rm.Since)) + " ago"
		}
		if rm.LastError != "" {
			d.Fault = explainFault(rm.LastErr, now)
			d.LastErrorAt = rm.LastErrorAt.UTC().Format("2006-01-02 15:04:05 UTC")
		}
		if rm.BrokerUnavailable != "" {
			why := brokerReason(rm.LastErr)
			if why == "" {
				why = rm.BrokerUnavailable
			}
			d.BrokerSays = "The broker says it cannot take messages for now: " + why + "; since " +
				rm.BrokerUnavailableSince.UTC().Format("15:04:05 UTC") + ", " + ago(now.Sub(rm.BrokerUnavailableSince)) + " ago"
		}
		if rm.NoSubscribers > 0 {
			d.NoSubscribers = fmt.Sprintf("%d reached the broker with no subscriber, last on %s at %s, %s ago", rm.NoSubscribers, rm.NoSubscribersTopic,
				rm.NoSubscribersAt.UTC().Format("15:04:05 UTC"), ago(now.Sub(rm.NoSubscribersAt)))
		}
		d.Role, d.RoleOK = role(rm)
		d.Trying = rm.Running && rm.HoldsLease && !rm.Connected
	}
	if rd.Err != nil {
		d.Err = rd.Err.Error()
	} else {
		g := rd.Gauges
		d.Pending, d.DeadCount = g.Pending, max(g.Dead-rd.ExpiredCount, 0)
		if !g.OldestPending.IsZero() {
			d.Oldest = ago(now.Sub(g.OldestPending))
		}
		for _, p := range g.Priorities {
			d.Priorities = append(d.Priorities, fmt.Sprintf("priority %d: %d pending, oldest %s", p.Priority, p.Pending, ago(now.Sub(p.OldestPending))))
		}
		d.Dead, d.Expired, d.ExpiredCount = rd.Dead, rd.Expired, rd.ExpiredCount
		if c := g.Commands; c.Waiting+c.Applied+c.Expired+c.Failed+c.Malformed > 0 {
			d.Commands = fmt.Sprintf("%d waiting, %d applied, %d expired, %d failed, %d malformed", c.Waiting, c.Applied, c.Expired, c.Failed, c.Malformed)
		}
	}
	q := rd.Query
	switch {
	case q.Get("requeued") != "":
		n, _ := strconv.Atoi(q.Get("requeued"))
		d.Notice = fmt.Sprintf("Requeued %d dead messages.", n)
	case q.Get("requeue") == "denied", q.Get("reconnect") == "denied":
		d.Notice = "Not done: wrong admin token."
	case q.Get("requeue") == "failed":
		d.Notice = "Not requeued: the database refused (see the relay's log)."
	case q.Get("reconnect") == "asked":
		d.Notice = "The relay was asked to try to connect now; this page shows how it went."
	}
	d.Spark = sparkline(rd.Samples, now)
	return d
}

// role says what this process does with the device's events, and whether
// that is as it should be: the lease and the last write, in a technician's
// words.
func role(rm *outbox.RelayMetrics) (string, bool) {
	switch {
	case !rm.Running:
		return "The relay is not running: nothing is sent from here.", false
	case !rm.HoldsLease:
		return "Another relay on this device is sending its events (or was until lately); this one stands by and takes over if that one stops.", false
	case !rm.LastWriteOK:
		return "This relay is the one that sends this device's events, but its last save to the disk failed (see Last error).", false
	}
	return "This relay is the one that sends this device's events; its last save to the disk worked.", true
}

// sparkline draws the backlog of the last hour as an inline SVG polyline:
// time left to right, from 0 at the grey baseline to the largest backlog at
// the top. A backlog that did not move is drawn at mid-height and said in
// words ("steady at 25"): a line on the baseline or the top edge reads as
// an underline or a border.
func sparkline(pts []sample, now time.Time) string {
	const w, h = 240.0, 48.0
	if len(pts) == 0 {
		return `<div class="muted" id="peak">no backlog figures yet</div>`
	}
	low, peak := pts[0].pending, pts[0].pending
	for _, p := range pts {
		low, peak = min(low, p.pending), max(peak, p.pending)
	}
	flat := low == peak
	top := max(peak, 1)
	var b strings.Builder
	var lastX, lastY float64
	// An hour, or what there is of it since start-up (10 s at least):
	// a device that just started shows its backlog's shape, not a line at
	// the right edge.
	span := min(max(now.Sub(pts[0].at), 10*time.Second), time.Hour)
	for i, p := range pts {
		x := w - now.Sub(p.at).Seconds()/span.Seconds()*w
		y := h - float64(p.pending)/float64(top)*(h-2) - 1
		if flat {
			y = h / 2
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		lastX, lastY = max(x, 0), y
		fmt.Fprintf(&b, "%.1f,%.1f", lastX, lastY)
	}
	label := fmt.Sprintf("from %d to %d over the last %s, now %d", low, peak, ago(span), pts[len(pts)-1].pending)
	// The scale, at the left edge: the peak at the top, 0 on the baseline;
	// a flat line's value just above it.
	scale := fmt.Sprintf(`<text x="3" y="10" %s>%d</text><text x="3" y="%g" %s>0</text>`, svgText, peak, h-3, svgText)
	if flat {
		label = fmt.Sprintf("steady at %d over the last %s", peak, ago(span))
		scale = fmt.Sprintf(`<text x="3" y="%g" %s>%d</text>`, h/2-4, svgText, peak)
	}
	// Every value here is a number this code formatted.
	return fmt.Sprintf(`<svg id="sparkline" xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" role="img" aria-label="backlog %s">`+
		`<rect width="%g" height="%g" fill="#f6f6f6"/><line x1="0" y1="%g" x2="%g" y2="%g" stroke="#bbb" stroke-width="1"/>%s`+
		`<polyline fill="none" stroke="#2563eb" stroke-width="2" points="%s"/><circle cx="%.1f" cy="%.1f" r="2.5" fill="#2563eb"/></svg>`+
		`<div class="muted" id="peak">%s</div>`, w, h, w, h, label, w, h, h-0.5, w, h-0.5, scale, b.String(), lastX, lastY, label)
}

// svgText is the sparkline's labels' style.
const svgText = `font-size="10" font-family="sans-serif" fill="#666"`

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
