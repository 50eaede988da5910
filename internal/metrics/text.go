package metrics

import (
	"io"
	"math"
	"strconv"
	"strings"
)

// ContentType is the media type of the text exposition format WriteText
// writes.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// helpEscaper and valueEscaper escape what the text format asks: in help
// text a backslash and a line feed, in a label value a double quote too.
var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	valueEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

// WriteText writes families in Prometheus' text exposition format, version
// 0.0.4, in the order given: # HELP and # TYPE, then each sample, a
// histogram as its cumulative _bucket series (le="+Inf" last), _sum and
// _count. No timestamps: the scrape's time is the samples'. A family with
// no samples, or that could not be read (Family.Err), is left out, as
// client_golang's registry leaves it out.
func WriteText(w io.Writer, families []Family) error {
	var b []byte
	for _, f := range families {
		if f.Err != nil || len(f.Samples) == 0 {
			continue
		}
		b = append(b, "# HELP "...)
		b = append(b, f.Name...)
		b = append(b, ' ')
		b = append(b, helpEscaper.Replace(f.Help)...)
		b = append(b, "\n# TYPE "...)
		b = append(b, f.Name...)
		b = append(b, ' ')
		b = append(b, f.Type.String()...)
		b = append(b, '\n')
		for _, s := range f.Samples {
			if f.Type != Histogram {
				b = appendSample(b, f.Name, "", f.Labels, s.LabelValues, "", s.Value)
				continue
			}
			h := s.Hist
			for i, le := range h.Bounds {
				b = appendSample(b, f.Name, "_bucket", f.Labels, s.LabelValues, formatFloat(le), float64(h.Counts[i]))
			}
			b = appendSample(b, f.Name, "_bucket", f.Labels, s.LabelValues, "+Inf", float64(h.Count))
			b = appendSample(b, f.Name, "_sum", f.Labels, s.LabelValues, "", h.Sum)
			b = appendSample(b, f.Name, "_count", f.Labels, s.LabelValues, "", float64(h.Count))
		}
	}
	_, err := w.Write(b)
	return err
}

// appendSample appends one line: name+suffix, the labels (and le, if not
// empty) and the value.
func appendSample(b []byte, name, suffix string, labels, values []string, le string, v float64) []byte {
	b = append(b, name...)
	b = append(b, suffix...)
	if len(labels) > 0 || le != "" {
		b = append(b, '{')
		for i, l := range labels {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendLabel(b, l, values[i])
		}
		if le != "" {
			if len(labels) > 0 {
				b = append(b, ',')
			}
			b = appendLabel(b, "le", le)
		}
		b = append(b, '}')
	}
	b = append(b, ' ')
	b = append(b, formatFloat(v)...)
	return append(b, '\n')
}

func appendLabel(b []byte, name, value string) []byte {
	b = append(b, name...)
	b = append(b, `="`...)
	b = append(b, valueEscaper.Replace(value)...)
	return append(b, '"')
}

// formatFloat writes a value as client_golang's expfmt does: the shortest
// representation that reads back the same, and NaN, +Inf, -Inf.
func formatFloat(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, +1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
