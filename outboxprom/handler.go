package outboxprom

import (
	"net/http"

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
	return e.mon.Handler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
}
