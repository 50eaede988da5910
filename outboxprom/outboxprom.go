// Package outboxprom exports an outbox and its relay to Prometheus, and
// serves the health endpoints and a status page a technician can read.
//
// It is a package of its own so that an application that does not want
// Prometheus does not link it: the outbox package knows nothing of it. The
// metrics are defined once, in the module's internal/metrics, and the
// endpoints and the page are internal/monitor's; the till's outboxctl
// serves the same without Prometheus's client, and a test holds the two
// expositions to the same families and values.
//
//	exp := outboxprom.New(ob, outboxprom.Options{Relay: relay})
//	defer exp.Close()
//	http.ListenAndServe("127.0.0.1:9464", exp.Handler())
//
// Handler serves /metrics, /healthz (the process runs), /readyz (the relay
// holds the lease and its last database write succeeded; it writes
// nothing) and / (the status page). Exporter is also a
// prometheus.Collector, for an application's own registry.
//
// A scrape reads the outbox's counters, two seeks and the dead rows' index
// (Outbox.Gauges) and the relay's memory (Relay.Metrics), whatever the
// backlog of priority 0, the default; a message of a higher priority is
// counted in that priority's index (BenchmarkScrape100k measures it at
// 100,000 pending messages; docs/metrics.md has the figures). The one figure that needs a scan,
// outbox_pending_bytes without a byte limit, is counted in the background
// every Options.RefreshInterval.
package outboxprom

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/metrics"
	"github.com/edgeoutbox/outbox/internal/monitor"
)

// Options configures an Exporter. The zero value is ready to use.
type Options struct {
	// Relay, if set, adds the relay's figures (connection, published,
	// timings) and makes /readyz follow it; without it /readyz fails.
	Relay *outbox.Relay
	// Version is outbox_info's version label. Default: the outbox module's
	// version in the build information, or "dev".
	Version string
	// RefreshInterval is how often the figures that need a scan of the
	// table are counted, in the background. Default 30 s.
	RefreshInterval time.Duration
	// SampleInterval is how often the backlog is sampled for the status
	// page's sparkline, which shows the last hour. Default 30 s.
	SampleInterval time.Duration
	// AdminToken, if set, enables the status page's buttons (requeue every
	// dead message, try to connect now): each a POST that must carry this token (typed into the form) and come from the
	// page's own origin. Empty: the page is read-only.
	AdminToken string
	// Logger receives the exporter's logs. Nil means slog.Default().
	Logger *slog.Logger
}

// Exporter exports one outbox and, optionally, its relay. It runs one
// background goroutine until Close.
type Exporter struct {
	mon   *monitor.Monitor
	log   *slog.Logger
	descs map[string]*prometheus.Desc // by family name
	order []*prometheus.Desc          // as Describe sends them
}

// New returns an exporter of ob and starts its background counting.
func New(ob *outbox.Outbox, opts Options) *Exporter {
	e := newDescs(opts.Relay != nil)
	e.mon = monitor.New(ob, monitor.Options(opts)) // the same fields: the conversion breaks the build if they part
	e.log = opts.Logger
	if e.log == nil {
		e.log = slog.Default()
	}
	return e
}

// newDescs returns an Exporter without a monitor, holding the Desc of
// each of the outbox's metric families.
func newDescs(relay bool) *Exporter {
	e := &Exporter{descs: map[string]*prometheus.Desc{}}
	for _, f := range metrics.Definitions(relay) {
		d := prometheus.NewDesc(f.Name, f.Help, f.Labels, nil)
		e.descs[f.Name] = d
		e.order = append(e.order, d)
	}
	return e
}

// Close stops the background goroutine and waits for it. The outbox is the
// caller's to close, after.
func (e *Exporter) Close() {
	e.mon.Close()
}

// Describe implements prometheus.Collector.
func (e *Exporter) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range e.order {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It scans nothing.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	e.collect(ch, e.mon.Families(context.Background()))
}

// collect sends families as client_golang metrics: a family that could
// not be read as an invalid metric (the registry reports its error).
func (e *Exporter) collect(ch chan<- prometheus.Metric, families []metrics.Family) {
	for _, f := range families {
		d := e.descs[f.Name]
		if f.Err != nil {
			ch <- prometheus.NewInvalidMetric(d, f.Err)
			continue
		}
		for _, s := range f.Samples {
			var m prometheus.Metric
			var err error
			switch f.Type {
			case metrics.Counter:
				m, err = prometheus.NewConstMetric(d, prometheus.CounterValue, s.Value, s.LabelValues...)
			case metrics.Histogram:
				h := s.Hist
				buckets := make(map[float64]uint64, len(h.Bounds))
				for i, b := range h.Bounds {
					buckets[b] = h.Counts[i]
				}
				m, err = prometheus.NewConstHistogram(d, h.Count, h.Sum, buckets, s.LabelValues...)
			default:
				m, err = prometheus.NewConstMetric(d, prometheus.GaugeValue, s.Value, s.LabelValues...)
			}
			if err != nil {
				m = prometheus.NewInvalidMetric(d, err)
			}
			ch <- m
		}
	}
}
