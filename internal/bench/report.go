package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

var sectionTitles = map[int]string{
	1:  "Enqueue overhead",
	2:  "Drain rate",
	3:  "Latency online",
	4:  "Catch-up after an outage",
	5:  "Memory",
	6:  "Size",
	7:  "Baseline: the articles' polling dispatcher",
	8:  "Durable before publish",
	9:  "A slow link used to its limit",
	10: "Writes to the flash, and a slow card",
	11: "NATS JetStream: drain and consumers",
}

// Meta describes the run: machine, versions, mode and duration.
type Meta struct {
	Mode           string             `json:"mode"`
	Date           string             `json:"date"`
	CPU            string             `json:"cpu"`
	NumCPU         int                `json:"nproc"`
	GOMAXPROCS     int                `json:"gomaxprocs"`
	OSArch         string             `json:"os_arch"`
	Kernel         string             `json:"kernel"`
	GoVersion      string             `json:"go_version"`
	SQLiteVersion  string             `json:"sqlite_version"`
	SQLiteDriver   string             `json:"sqlite_driver"`
	Paho           string             `json:"paho_version"`
	Mochi          string             `json:"mochi_version"`
	Mosquitto      string             `json:"mosquitto_version"`
	LoadStart      string             `json:"loadavg_start"`
	LoadEnd        string             `json:"loadavg_end"`
	Seconds        float64            `json:"seconds"`
	SectionSeconds map[string]float64 `json:"section_seconds"`
}

// figure is one measured value.
type figure struct {
	key     string
	section int
	label   string
	unit    string // tx/s, msg/s, ratio, ms, MiB, bytes, s, count, bool, text, fsyncs, events, ns
	value   any    // nil until measured (or when unavailable)
	target  string // e.g. "≥ 0.90"; empty if none
	met     *bool
}

// Report holds every figure, in the order they are printed.
type Report struct {
	Meta    Meta
	figs    []*figure
	byKey   map[string]*figure
	notes   map[int][]string
	missing map[int]string // section → why it did not run
}

func newReport() *Report {
	r := &Report{byKey: map[string]*figure{}, notes: map[int][]string{}, missing: map[int]string{}}
	r.Meta.SectionSeconds = map[string]float64{}
	for _, k := range keys {
		f := &figure{key: k.key, section: k.section, label: k.label, unit: k.unit, target: k.target}
		r.figs = append(r.figs, f)
		r.byKey[k.key] = f
	}
	return r
}

// set records a figure's value; the key must be documented in keys.
func (r *Report) set(key string, v any) {
	f, ok := r.byKey[key]
	if !ok {
		panic("bench: undocumented key " + key)
	}
	if x, ok := v.(float64); ok && (math.IsNaN(x) || math.IsInf(x, 0)) {
		v = nil
	}
	f.value = v
}

// check records whether a figure met its target.
func (r *Report) check(key string, met bool) {
	f := r.byKey[key]
	if f.target == "" {
		panic("bench: no target for " + key)
	}
	f.met = &met
}

func (r *Report) note(section int, format string, args ...any) {
	r.notes[section] = append(r.notes[section], fmt.Sprintf(format, args...))
}

// Value returns a figure's value (nil if not measured); for tests.
func (r *Report) Value(key string) any {
	if f, ok := r.byKey[key]; ok {
		return f.value
	}
	return nil
}

// Keys lists every key of the JSON object with its meaning.
func Keys() []string {
	var out []string
	for _, k := range keys {
		out = append(out, k.key)
	}
	return out
}

// KeysMarkdown writes the JSON keys as a Markdown table: key, section,
// meaning, unit and target.
func KeysMarkdown(w io.Writer) {
	fmt.Fprintf(w, "| key | section | meaning | unit | target |\n|---|---|---|---|---|\n")
	for _, k := range keys {
		fmt.Fprintf(w, "| `%s` | %d | %s | %s | %s |\n", k.key, k.section, k.label, k.unit, k.target)
	}
}

// MarshalJSON writes one object: the run's meta fields, then one key per
// figure (null if it was not measured), then "targets" (each figure that has
// a target: the target and whether it was met) and "notes".
func (r *Report) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	meta, err := json.Marshal(r.Meta)
	if err != nil {
		return nil, err
	}
	b.Write(meta[:len(meta)-1]) // without the closing brace
	for _, f := range r.figs {
		v, err := json.Marshal(f.value)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, ",%q:%s", f.key, v)
	}
	type target struct {
		Figure string `json:"figure"`
		Target string `json:"target"`
		Met    *bool  `json:"met"`
	}
	targets := []target{}
	for _, f := range r.figs {
		if f.target != "" {
			targets = append(targets, target{f.key, f.target, f.met})
		}
	}
	t, _ := json.Marshal(targets)
	fmt.Fprintf(&b, ",\"targets\":%s", t)
	notes := map[string][]string{}
	for s, n := range r.notes {
		notes[strconv.Itoa(s)] = n
	}
	for s, why := range r.missing {
		notes[strconv.Itoa(s)] = append(notes[strconv.Itoa(s)], "not run: "+why)
	}
	n, _ := json.Marshal(notes)
	fmt.Fprintf(&b, ",\"notes\":%s}", n)
	return b.Bytes(), nil
}

// Markdown writes the report as Markdown: the machine, then one table per
// section.
func (r *Report) Markdown(w io.Writer) {
	m := r.Meta
	fmt.Fprintf(w, "# outboxlab bench (%s)\n\n", m.Mode)
	fmt.Fprintf(w, "| | |\n|---|---|\n")
	fmt.Fprintf(w, "| date | %s |\n| machine | %s, %d CPUs (GOMAXPROCS %d), %s, Linux %s |\n", m.Date, m.CPU, m.NumCPU, m.GOMAXPROCS, m.OSArch, m.Kernel)
	fmt.Fprintf(w, "| Go | %s |\n| SQLite | %s (%s, pure Go) |\n| MQTT | paho %s; brokers: mochi %s (in-process)", m.GoVersion, m.SQLiteVersion, m.SQLiteDriver, m.Paho, m.Mochi)
	if m.Mosquitto != "" {
		fmt.Fprintf(w, ", Mosquitto %s (local process)", m.Mosquitto)
	}
	fmt.Fprintf(w, " |\n| run time | %.0f s |\n| load average (1, 5, 15 min) | %s at the start, %s at the end |\n", m.Seconds, m.LoadStart, m.LoadEnd)
	for s := 1; s <= len(sectionTitles); s++ {
		fmt.Fprintf(w, "\n## %d. %s\n\n", s, sectionTitles[s])
		if why, ok := r.missing[s]; ok {
			fmt.Fprintf(w, "Not run: %s.\n", why)
			continue
		}
		fmt.Fprintf(w, "| measure | value | target |\n|---|---:|---|\n")
		for _, f := range r.figs {
			if f.section != s || f.value == nil && f.target == "" {
				continue
			}
			fmt.Fprintf(w, "| %s | %s | %s |\n", f.label, formatValue(f), formatTarget(f))
		}
		for _, n := range r.notes[s] {
			fmt.Fprintf(w, "\n%s\n", n)
		}
	}
}

func formatTarget(f *figure) string {
	switch {
	case f.target == "":
		return ""
	case f.met == nil:
		return f.target + " (not measured)"
	case *f.met:
		return f.target + " **met**"
	}
	return f.target + " **MISSED**"
}

func formatValue(f *figure) string {
	switch v := f.value.(type) {
	case nil:
		return "–"
	case bool:
		if v {
			return "yes"
		}
		return "no"
	case string:
		return v
	case int:
		return thousands(int64(v)) + unitSuffix(f.unit)
	case int64:
		return thousands(v) + unitSuffix(f.unit)
	case float64:
		switch f.unit {
		case "ratio":
			return fmt.Sprintf("%.2f", v)
		case "ms":
			return fmtMS(v)
		case "MiB":
			return fmt.Sprintf("%.1f MiB", v)
		case "MB":
			return fmt.Sprintf("%.1f MB", v)
		case "s":
			return fmt.Sprintf("%.1f s", v)
		case "µs":
			return fmt.Sprintf("%.1f µs", v)
		case "allocs", "B":
			return fmt.Sprintf("%.1f", v) + unitSuffix(f.unit)
		case "fsyncs", "events":
			return fmt.Sprintf("%.2f", v) + unitSuffix(f.unit)
		}
		return thousands(int64(math.Round(v))) + unitSuffix(f.unit)
	}
	return fmt.Sprint(f.value)
}

func unitSuffix(u string) string {
	switch u {
	case "", "count", "ratio", "text", "bool":
		return ""
	case "bytes":
		return " B"
	}
	return " " + u
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
