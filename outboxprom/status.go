package outboxprom

import (
	"context"
	"fmt"
	"html/template"
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
	Published   int64
	Dead        []outbox.Record
	DeadCount   int64
	CanRequeue  bool
	Notice      string
	Spark       template.HTML // an inline SVG
	Refresh     int
	Now         string
	Err         string
}

var statusTmpl = template.Must(template.New("status").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>outbox: {{if .HasRelay}}{{if .Connected}}connected{{else}}NOT connected{{end}}{{else}}status{{end}}, {{.Pending}} pending</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222;max-width:70rem}
h1{font-size:1.3rem;margin:0 0 1rem} .muted{color:#666;font-size:.9rem}
.state{font-size:1.6rem;font-weight:bold;padding:.6rem 1rem;border-radius:.4rem;display:inline-block}
.up{background:#d9f2dd;color:#14532d} .down{background:#fde2e1;color:#7f1d1d}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(14rem,1fr));gap:1rem;margin:1rem 0}
.card{border:1px solid #ddd;border-radius:.4rem;padding:.7rem 1rem} .big{font-size:1.5rem;font-weight:bold}
table{border-collapse:collapse;width:100%} td,th{border-bottom:1px solid #eee;padding:.3rem .5rem;text-align:left;font-size:.9rem;vertical-align:top}
.notice{background:#fff7d6;padding:.5rem 1rem;border-radius:.4rem} .err{color:#7f1d1d}
</style></head><body>
<h1>outbox on {{.Source}} <span class="muted">version {{.Version}}, page of {{.Now}}, refreshes every {{.Refresh}} s</span></h1>
{{if .Notice}}<p class="notice" id="notice">{{.Notice}}</p>{{end}}
{{if .Err}}<p class="err" id="error">Cannot read the outbox: {{.Err}}</p>{{end}}
{{if .HasRelay}}
<p><span id="state" data-connected="{{.Connected}}" class="state {{if .Connected}}up">Connected to the broker{{else}}down">NOT connected to the broker{{end}}</span>
<span class="muted" id="since">{{if .Since}}since {{.Since}}{{end}}{{if not .Connected}}; {{.Attempts}} connection attempts so far{{end}}</span></p>
<p id="mqtt">MQTT version (of the last connection): <b>{{if .Protocol}}{{.Protocol}}{{else}}not known yet{{end}}</b>.
{{if .Ready}}<span class="err" id="ready">Not ready: {{.Ready}}</span>{{else}}<span id="ready">Ready: holds the lease, last database write succeeded.</span>{{end}}</p>
{{else}}<p id="state" data-connected="unknown">No relay runs in this process.</p>{{end}}
<div class="grid">
<div class="card"><div class="muted">Waiting to be sent</div><div class="big" id="pending">{{.Pending}}</div>
<div class="muted" id="oldest">{{if .Oldest}}oldest waits for {{.Oldest}}{{else}}nothing waits{{end}}</div></div>
<div class="card"><div class="muted">Backlog</div>{{.Spark}}</div>
<div class="card"><div class="muted">Sent since start</div><div class="big" id="published">{{.Published}}</div></div>
<div class="card"><div class="muted">Dead messages</div><div class="big" id="dead-count">{{.DeadCount}}</div></div>
</div>
<h2>Last error</h2>
<p id="last-error">{{if .LastError}}{{.LastError}} <span class="muted">({{.LastErrorAt}})</span>{{else}}none{{end}}</p>
<h2>Dead messages</h2>
{{if .Dead}}<table id="dead"><tr><th>id</th><th>topic</th><th>attempts</th><th>why</th><th>parked</th></tr>
{{range .Dead}}<tr><td>{{.ID}}</td><td>{{.Topic}}</td><td>{{.Attempts}}</td><td>{{.LastError}}</td><td>{{.DeadAt.UTC.Format "2006-01-02 15:04:05"}} UTC</td></tr>
{{end}}</table>{{if gt .DeadCount (len .Dead)}}<p class="muted">and {{.DeadCount}} in all; outboxctl list --state dead shows every one.</p>{{end}}
{{if .CanRequeue}}<form method="post" action="/requeue" id="requeue">
<label>Admin token <input type="password" name="token" autocomplete="off" required></label>
<button type="submit">Requeue every dead message</button></form>
{{else}}<p class="muted" id="read-only">Read-only: the relay was started without an admin token, so nothing can be requeued here (outboxctl requeue can).</p>{{end}}
{{else}}<p id="dead">none</p>{{end}}
</body></html>
`))

func (e *Exporter) statusPage(w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
	defer cancel()
	now := time.Now()
	d := statusData{Version: e.opts.Version, Refresh: statusRefresh, Now: now.UTC().Format("15:04:05 UTC"), CanRequeue: e.opts.AdminToken != ""}
	if r := e.opts.Relay; r != nil {
		m := r.Metrics()
		d.HasRelay, d.Connected, d.Protocol, d.Source = true, m.Connected, m.Protocol, m.Source
		d.Attempts, d.Published, d.LastError = m.ConnectionAttempts, m.Published, m.LastError
		if !m.Since.IsZero() {
			d.Since = m.Since.UTC().Format("15:04:05 UTC") + ", " + ago(now.Sub(m.Since)) + " ago"
		}
		if !m.LastErrorAt.IsZero() {
			d.LastErrorAt = m.LastErrorAt.UTC().Format("2006-01-02 15:04:05 UTC")
		}
		d.Ready = e.notReady()
	}
	if d.Source == "" {
		d.Source = "this device"
	}
	g, err := e.ob.Gauges(ctx)
	if err == nil {
		d.Pending, d.DeadCount = g.Pending, g.Dead
		if !g.OldestPending.IsZero() {
			d.Oldest = ago(now.Sub(g.OldestPending))
		}
		if g.Dead > 0 {
			d.Dead, err = e.ob.List(ctx, outbox.ListOptions{State: outbox.StateDead, Limit: maxDeadShown})
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
	e.mu.Lock()
	pts := append([]sample(nil), e.samples...)
	e.mu.Unlock()
	if err == nil {
		pts = append(pts, sample{at: now, pending: g.Pending})
	}
	d.Spark = sparkline(pts, now)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// The page is for this listener only: no framing by another site.
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	if err := statusTmpl.Execute(w, d); err != nil {
		e.log.Debug("outboxprom: writing the status page", "err", err)
	}
}

// sparkline draws the backlog of the last hour as an inline SVG polyline:
// time left to right, the largest backlog at the top.
func sparkline(pts []sample, now time.Time) template.HTML {
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
	return template.HTML(fmt.Sprintf(`<svg id="sparkline" xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" role="img" aria-label="backlog over the last hour, at most %d">`+
		`<rect width="%g" height="%g" fill="#f6f6f6"/><polyline fill="none" stroke="#2563eb" stroke-width="2" points="%s"/></svg>`+
		`<div class="muted" id="peak">peak %d over the last %s</div>`, w, h, w, h, peak, w, h, b.String(), peak, ago(span)))
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

// sampleCount is how many backlog samples the sparkline has (for tests).
func (e *Exporter) sampleCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.samples)
}
