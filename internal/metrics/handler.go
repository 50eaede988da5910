package metrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
)

// handlerErrorsName is client_golang's promhttp counter of scrapes that
// failed in part; the till's exposition has it too.
const handlerErrorsName = "promhttp_metric_handler_errors_total"

// Source reads metric families, once per scrape.
type Source func(ctx context.Context) []Family

// Handler serves the families of sources in the text exposition format,
// sorted by name as client_golang's registry sorts them. It does not
// compress: the exposition is a few kilobytes. A family that could not be
// read is left out, as client_golang leaves it out, and, as promhttp does,
// logged and counted in promhttp_metric_handler_errors_total{cause=
// "gathering"}, so that one alert rule serves both expositions.
func Handler(log *slog.Logger, sources ...Source) http.Handler {
	var failed atomic.Int64 // scrapes that could not read every family
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var families []Family
		for _, src := range sources {
			families = append(families, src(req.Context())...)
		}
		var errs []error
		for _, f := range families {
			if f.Err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", f.Name, f.Err))
			}
		}
		if len(errs) > 0 {
			failed.Add(1)
			log.Warn("outbox metrics: a scrape could not read every family", "err", errors.Join(errs...))
		}
		families = append(families, Family{Name: handlerErrorsName, Type: Counter, Labels: []string{"cause"},
			Help:    "Total number of internal errors encountered by the promhttp metric handler.",
			Samples: []Sample{{LabelValues: []string{"encoding"}}, {LabelValues: []string{"gathering"}, Value: float64(failed.Load())}}})
		slices.SortStableFunc(families, func(a, b Family) int { return strings.Compare(a.Name, b.Name) })
		var b bytes.Buffer
		_ = WriteText(&b, families) // a bytes.Buffer does not fail
		w.Header().Set("Content-Type", ContentType)
		_, _ = w.Write(b.Bytes())
	})
}
