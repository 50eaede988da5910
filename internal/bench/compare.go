package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// StoredReport is a report as `outboxlab bench --json` printed it, read back.
type StoredReport struct {
	// Name is the file's base name, which is how the comparison names it.
	Name string
	Meta Meta
	// Figures holds every key of the report that is not the run's meta,
	// its targets or its notes: a float64, bool or string, or nil where the
	// figure was not measured. A key this binary does not document (from a
	// newer binary) is kept but not compared.
	Figures map[string]any
}

// runFields are the report's keys that are not figures: Meta's, then the
// two that MarshalJSON appends.
var runFields = func() map[string]bool {
	m := map[string]bool{"targets": true, "notes": true}
	t := reflect.TypeFor[Meta]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		m[name] = true
	}
	return m
}()

// LoadReport reads a report that `outboxlab bench --json` wrote to path.
func LoadReport(path string) (*StoredReport, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := ParseReport(filepath.Base(path), data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// ParseReport parses a report of `outboxlab bench --json`; name is how the
// comparison will call it.
func ParseReport(name string, data []byte) (*StoredReport, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("not a bench report: %w", err)
	}
	if raw["date"] == nil || raw["mode"] == nil {
		return nil, errors.New("not a bench report: no date or mode (write one with outboxlab bench --json)")
	}
	r := &StoredReport{Name: name, Figures: map[string]any{}}
	if err := json.Unmarshal(data, &r.Meta); err != nil {
		return nil, fmt.Errorf("the run's meta fields: %w", err)
	}
	for k, v := range raw {
		if runFields[k] {
			continue
		}
		var x any
		d := json.NewDecoder(bytes.NewReader(v))
		if err := d.Decode(&x); err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		switch x.(type) {
		case nil, float64, bool, string:
			r.Figures[k] = x
		default:
			return nil, fmt.Errorf("%s: a figure is a number, a boolean, a string or null, not %s", k, v)
		}
	}
	return r, nil
}

// Compare writes as Markdown, section by section, every documented figure
// that each run of a and of b measured: each run's value and, for numbers,
// the ratio of b's mean to a's. A figure missing from any run (a section
// not run, Mosquitto absent, a key newer than the run) is left out, so that
// each mean is over every run of its side.
func Compare(w io.Writer, a, b []*StoredReport) error {
	if len(a) == 0 || len(b) == 0 {
		return errors.New("compare needs at least one run on each side")
	}
	fmt.Fprintf(w, "| side | run | date | mode | load average (start; end) |\n|---|---|---|---|---|\n")
	for _, side := range []struct {
		name string
		runs []*StoredReport
	}{{"A", a}, {"B", b}} {
		for _, r := range side.runs {
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s; %s |\n", side.name, r.Name, r.Meta.Date, r.Meta.Mode, r.Meta.LoadStart, r.Meta.LoadEnd)
		}
	}
	all := append(slices.Clone(a), b...)
	for _, r := range all[1:] {
		m, m0 := r.Meta, all[0].Meta
		if m.CPU != m0.CPU || m.NumCPU != m0.NumCPU || m.OSArch != m0.OSArch {
			fmt.Fprintf(w, "\nNot one machine: %s ran on %s, %d CPUs, %s; %s on %s, %d CPUs, %s. Compare the ratios within a run, not the rates.\n",
				all[0].Name, m0.CPU, m0.NumCPU, m0.OSArch, r.Name, m.CPU, m.NumCPU, m.OSArch)
			break
		}
	}
	rows := 0
	for s := 1; s <= len(sectionTitles); s++ {
		header := false
		for _, k := range keys {
			if k.section != s {
				continue
			}
			av, aok := values(a, k.key)
			bv, bok := values(b, k.key)
			if !aok || !bok {
				continue
			}
			if !header {
				fmt.Fprintf(w, "\n## %d. %s\n\n| key | unit | A | B | B / A (means) |\n|---|---|---|---|---:|\n", s, sectionTitles[s])
				header = true
			}
			fmt.Fprintf(w, "| `%s` | %s | %s | %s | %s |\n", k.key, k.unit, list(av), list(bv), ratioOfMeans(av, bv))
			rows++
		}
	}
	if rows == 0 {
		fmt.Fprintf(w, "\nNo figure was measured in every run of both sides.\n")
	}
	return nil
}

// values returns key's value in each run, and false if a run lacks it.
func values(runs []*StoredReport, key string) ([]any, bool) {
	var out []any
	for _, r := range runs {
		v := r.Figures[key]
		if v == nil {
			return nil, false
		}
		out = append(out, v)
	}
	return out, true
}

func list(vs []any) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = compareValue(v)
	}
	return strings.Join(s, ", ")
}

// compareValue shows a value to three significant figures, whole numbers
// from 1,000 up, so that a column's runs read alike.
func compareValue(v any) string {
	switch x := v.(type) {
	case bool:
		if x {
			return "yes"
		}
		return "no"
	case float64:
		if x >= 1000 || x <= -1000 {
			return thousands(int64(math.Round(x)))
		}
		return strconv.FormatFloat(x, 'g', 3, 64)
	}
	return fmt.Sprint(v)
}

// ratioOfMeans is mean(b) / mean(a) to two decimals; empty when the values
// are not numbers, "–" when a's mean is zero.
func ratioOfMeans(a, b []any) string {
	ma, aok := mean(a)
	mb, bok := mean(b)
	switch {
	case !aok || !bok:
		return ""
	case ma == 0:
		return "–"
	}
	return fmt.Sprintf("%.2f", mb/ma)
}

func mean(vs []any) (float64, bool) {
	sum := 0.0
	for _, v := range vs {
		x, ok := v.(float64)
		if !ok {
			return 0, false
		}
		sum += x
	}
	return sum / float64(len(vs)), true
}
