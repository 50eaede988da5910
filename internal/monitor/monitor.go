// Package monitor serves what a technician and Prometheus watch of an
// outbox and its relay: /healthz, /readyz, the status page with its
// requeue button, and the outbox's metric families (internal/metrics) read
// at each scrape, with the background counting they need.
//
// Two things mount it: outboxprom, whose /metrics is client_golang's
// registry over those families, and the till's outboxctl, whose /metrics
// is TextMetrics, written without Prometheus's client.
package monitor

import (
	"context"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/metrics"
)

// Options configures a Monitor. outboxprom.Options, which configures an
// Exporter, is converted to it: the two have the same fields, documented
// for users there. The zero value is ready to use.
type Options struct {
	Relay           *outbox.Relay // nil: no relay's figures, and never ready
	Version         string        // outbox_info's version; default the module's, or "dev"
	RefreshInterval time.Duration // how often the pending bytes are counted when they need a scan; default 30 s
	SampleInterval  time.Duration // how often the backlog is sampled for the sparkline; default 30 s
	AdminToken      string        // enables the page's buttons; empty: a read-only page
	Logger          *slog.Logger  // nil: slog.Default()
}

// Monitor watches one outbox and, optionally, its relay. It runs one
// background goroutine until Close.
type Monitor struct {
	ob   *outbox.Outbox
	opts Options
	log  *slog.Logger

	stop context.CancelFunc
	done chan struct{}

	mu      sync.Mutex
	scanned outbox.Stats // the last background count
	samples []sample     // the backlog, oldest first, at most an hour
}

type sample struct {
	at      time.Time
	pending int64
}

// New returns a monitor of ob and starts its background counting.
func New(ob *outbox.Outbox, opts Options) *Monitor {
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = 30 * time.Second
	}
	if opts.SampleInterval <= 0 {
		opts.SampleInterval = 30 * time.Second
	}
	if opts.Version == "" {
		opts.Version = moduleVersion()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Monitor{ob: ob, opts: opts, log: opts.Logger, stop: cancel, done: make(chan struct{})}
	go m.background(ctx)
	return m
}

// Close stops the background goroutine and waits for it. The outbox is the
// caller's to close, after.
func (m *Monitor) Close() {
	m.stop()
	<-m.done
}

func moduleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	v := ""
	if bi.Main.Path == "github.com/edgeoutbox/outbox" {
		v = bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/edgeoutbox/outbox" {
			v = d.Version
		}
	}
	if v == "" || v == "(devel)" {
		return "dev"
	}
	return v
}

// background counts what needs a scan and samples the backlog.
func (m *Monitor) background(ctx context.Context) {
	defer close(m.done)
	m.refresh(ctx)
	m.sampleNow(ctx)
	refresh := time.NewTicker(m.opts.RefreshInterval)
	defer refresh.Stop()
	samples := time.NewTicker(m.opts.SampleInterval)
	defer samples.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-refresh.C:
			m.refresh(ctx)
		case <-samples.C:
			m.sampleNow(ctx)
		}
	}
}

func (m *Monitor) refresh(ctx context.Context) {
	if g, err := m.ob.Gauges(ctx); err == nil && g.PendingBytesKnown {
		return // the counters have it: no scan
	}
	s, err := m.ob.Stats(ctx)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("monitor: counting the outbox failed", "err", err)
		}
		return
	}
	m.mu.Lock()
	m.scanned = s
	m.mu.Unlock()
}

func (m *Monitor) sampleNow(ctx context.Context) {
	g, err := m.ob.Gauges(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.samples = append(m.samples, sample{at: now, pending: g.Pending})
	i := 0
	for i < len(m.samples) && now.Sub(m.samples[i].at) > time.Hour {
		i++
	}
	m.samples = append(m.samples[:0], m.samples[i:]...)
}

// Families reads the outbox's metric families: its gauges (no scan), the
// background count of the pending bytes where they need one, and the
// relay's figures from memory.
func (m *Monitor) Families(ctx context.Context) []metrics.Family {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s := metrics.Snapshot{Version: m.opts.Version}
	s.Gauges, s.GaugesErr = m.ob.Gauges(ctx)
	s.Now = time.Now()
	m.mu.Lock()
	s.ScannedPendingBytes = m.scanned.PendingBytes
	m.mu.Unlock()
	if r := m.opts.Relay; r != nil {
		rm := r.Metrics()
		s.Relay = &rm
	}
	return metrics.Outbox(s)
}

// TextMetrics serves /metrics without Prometheus's client: the outbox's
// families with the process's and a few of the Go runtime's, in the text
// exposition format. It is what the till's outboxctl serves.
func (m *Monitor) TextMetrics() http.Handler {
	return metrics.Handler(m.log, m.Families, metrics.Runtime, metrics.Process)
}

// SampleCount is how many backlog samples the sparkline has; tests wait
// on it.
func (m *Monitor) SampleCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.samples)
}
