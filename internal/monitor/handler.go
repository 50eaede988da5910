package monitor

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// Handler returns the monitor's endpoints, to mount at the root of a
// listener:
//
//   - GET /metrics: exposition, the caller's exposition of Families
//     (outboxprom's registry, or TextMetrics);
//   - GET /healthz: 200 while the process serves it;
//   - GET /readyz: 200 while the relay runs, holds the lease and its last
//     database write succeeded, else 503 with the reason (no probe writes);
//   - GET /: the status page; POST /requeue and POST /reconnect: its
//     buttons (requeue every dead message, try to connect now), behind
//     the admin token.
func (m *Monitor) Handler(exposition http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", exposition)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", m.readyz)
	mux.HandleFunc("GET /{$}", m.statusPage)
	mux.HandleFunc("POST /requeue", m.requeue)
	mux.HandleFunc("POST /reconnect", m.reconnect)
	return mux
}

// notReady says why the relay is not ready, or "" if it is.
func (m *Monitor) notReady() string {
	r := m.opts.Relay
	if r == nil {
		return "no relay in this process"
	}
	rm := r.Metrics()
	switch {
	case !rm.Running:
		return "the relay is not running"
	case !rm.HoldsLease:
		return "the relay does not hold the lease (another relay drains this database, or it waits for the lease)"
	case !rm.LastWriteOK:
		return "the relay's last database write failed: " + rm.LastError
	}
	return ""
}

func (m *Monitor) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if why := m.notReady(); why != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready:", why)
		return
	}
	fmt.Fprintln(w, "ready")
}

// sameOrigin reports whether a POST comes from a page of this listener: its
// Origin, or without one its Referer, names the host the request was sent
// to. A form on another site cannot forge either in a browser.
func sameOrigin(req *http.Request) bool {
	src := req.Header.Get("Origin")
	if src == "" || src == "null" {
		src = req.Header.Get("Referer")
	}
	if src == "" {
		return false
	}
	u, err := url.Parse(src)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return strings.EqualFold(u.Host, req.Host)
}

// admitted reports whether a POST of the page's form for action may act:
// the page has buttons (an admin token is set), the form comes from the
// page's own origin and carries the token. It answers the request when not,
// redirecting a wrong token to the page with what=denied.
func (m *Monitor) admitted(w http.ResponseWriter, req *http.Request, action string) bool {
	w.Header().Set("Cache-Control", "no-store")
	if m.opts.AdminToken == "" {
		http.Error(w, "the status page is read-only: the relay was started without an admin token", http.StatusForbidden)
		return false
	}
	if !sameOrigin(req) {
		http.Error(w, "refused: the request does not come from this page", http.StatusForbidden)
		return false
	}
	req.Body = http.MaxBytesReader(w, req.Body, 4096)
	if err := req.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return false
	}
	// Hashed first, so that the comparison takes the same time whatever
	// the length typed.
	got, want := sha256.Sum256([]byte(req.PostForm.Get("token"))), sha256.Sum256([]byte(m.opts.AdminToken))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		m.log.Warn("monitor: "+action+" refused: wrong admin token", "remote", req.RemoteAddr)
		http.Redirect(w, req, "/?"+action+"=denied", http.StatusSeeOther)
		return false
	}
	return true
}

func (m *Monitor) requeue(w http.ResponseWriter, req *http.Request) {
	if !m.admitted(w, req, "requeue") {
		return
	}
	n, err := m.ob.RequeueDead(req.Context())
	if err != nil {
		m.log.Warn("monitor: requeue failed", "err", err)
		http.Redirect(w, req, "/?requeue=failed", http.StatusSeeOther)
		return
	}
	m.log.Info("monitor: dead messages requeued from the status page", "messages", n, "remote", req.RemoteAddr)
	http.Redirect(w, req, fmt.Sprintf("/?requeued=%d", n), http.StatusSeeOther)
}

// reconnect is the page's "Try to connect now": it ends the relay's wait
// before its next connection attempt (Relay.ReconnectNow), for a technician
// who has just brought the broker or the network back.
func (m *Monitor) reconnect(w http.ResponseWriter, req *http.Request) {
	if m.opts.Relay == nil {
		http.Error(w, "no relay runs in this process", http.StatusNotFound)
		return
	}
	if !m.admitted(w, req, "reconnect") {
		return
	}
	m.opts.Relay.ReconnectNow()
	m.log.Info("monitor: connection attempt asked for from the status page", "remote", req.RemoteAddr)
	http.Redirect(w, req, "/?reconnect=asked", http.StatusSeeOther)
}
