package outboxprom

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler returns the exporter's endpoints, to mount at the root of a
// listener:
//
//   - GET /metrics: the exporter's metrics, with the Go runtime's and the
//     process's, in Prometheus' text format;
//   - GET /healthz: 200 while the process serves it;
//   - GET /readyz: 200 while the relay runs, holds the lease and its last
//     database write succeeded, else 503 with the reason (no probe writes);
//   - GET /: the status page; POST /requeue: its requeue button.
func (e *Exporter) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(e, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", e.readyz)
	mux.HandleFunc("GET /{$}", e.statusPage)
	mux.HandleFunc("POST /requeue", e.requeue)
	return mux
}

// notReady says why the relay is not ready, or "" if it is.
func (e *Exporter) notReady() string {
	r := e.opts.Relay
	if r == nil {
		return "no relay in this process"
	}
	m := r.Metrics()
	switch {
	case !m.Running:
		return "the relay is not running"
	case !m.HoldsLease:
		return "the relay does not hold the lease (another relay drains this database, or it waits for the lease)"
	case !m.LastWriteOK:
		return "the relay's last database write failed: " + m.LastError
	}
	return ""
}

func (e *Exporter) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if why := e.notReady(); why != "" {
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

func (e *Exporter) requeue(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if e.opts.AdminToken == "" {
		http.Error(w, "the status page is read-only: the relay was started without an admin token", http.StatusForbidden)
		return
	}
	if !sameOrigin(req) {
		http.Error(w, "refused: the request does not come from this page", http.StatusForbidden)
		return
	}
	req.Body = http.MaxBytesReader(w, req.Body, 4096)
	if err := req.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	// Hashed first, so that the comparison takes the same time whatever
	// the length typed.
	got, want := sha256.Sum256([]byte(req.PostForm.Get("token"))), sha256.Sum256([]byte(e.opts.AdminToken))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		e.log.Warn("outboxprom: requeue refused: wrong admin token", "remote", req.RemoteAddr)
		http.Redirect(w, req, "/?requeue=denied", http.StatusSeeOther)
		return
	}
	n, err := e.ob.RequeueDead(req.Context())
	if err != nil {
		e.log.Warn("outboxprom: requeue failed", "err", err)
		http.Redirect(w, req, "/?requeue=failed", http.StatusSeeOther)
		return
	}
	e.log.Info("outboxprom: dead messages requeued from the status page", "messages", n, "remote", req.RemoteAddr)
	http.Redirect(w, req, fmt.Sprintf("/?requeued=%d", n), http.StatusSeeOther)
}
