package outboxprom

import (
	"fmt"
	"log/slog"
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
//   - GET /: the status page; POST /requeue and POST /reconnect: its
//     buttons (requeue every dead message, try to connect now), behind
//     Options.AdminToken.
//
// A family that cannot be read is left out, the rest served; the error is
// logged, and counted in promhttp_metric_handler_errors_total{cause=
// "gathering"}, so that a scrape that lost series is never silent.
func (e *Exporter) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(e, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return e.mon.Handler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      errorLog{e.log},
		Registry:      reg, // registers the errors counter
	}))
}

// errorLog is promhttp's error log on the exporter's logger.
type errorLog struct{ log *slog.Logger }

func (l errorLog) Println(v ...any) {
	l.log.Warn("outbox metrics: a scrape could not read every family", "err", fmt.Sprint(v...))
}
