package metrics

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"strings"
)

// Source reads metric families, once per scrape.
type Source func(ctx context.Context) []Family

// Handler serves the families of sources in the text exposition format,
// sorted by name as client_golang's registry sorts them. It does not
// compress: the exposition is a few kilobytes.
func Handler(sources ...Source) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var families []Family
		for _, src := range sources {
			families = append(families, src(req.Context())...)
		}
		slices.SortStableFunc(families, func(a, b Family) int { return strings.Compare(a.Name, b.Name) })
		var b bytes.Buffer
		_ = WriteText(&b, families) // a bytes.Buffer does not fail
		w.Header().Set("Content-Type", ContentType)
		_, _ = w.Write(b.Bytes())
	})
}
