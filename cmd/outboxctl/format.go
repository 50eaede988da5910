package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func ageText(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d < 0:
		return "in the future (clock changed)"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

func limitsText(count, bytes int64) string {
	if count == 0 && bytes == 0 {
		return "none"
	}
	s := ""
	if count > 0 {
		s = fmt.Sprintf("%d messages", count)
	}
	if bytes > 0 {
		if s != "" {
			s += ", "
		}
		s += bytesText(bytes)
	}
	return s
}
