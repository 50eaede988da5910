package migrate

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// TestNamesAfter: NamesAfter finds what regexps find, in the schemas' own
// files and in the cases around their edges (the regexps it replaced, with
// IF NOT EXISTS skipped after each prefix).
func TestNamesAfter(t *testing.T) {
	cases := []struct {
		re        *regexp.Regexp
		prefix    string
		lineStart bool
		end       string
	}{
		{regexp.MustCompile(`(?m)^CREATE TABLE (?:IF NOT EXISTS )?(\w+)`), "CREATE TABLE ", true, ""},
		{regexp.MustCompile(`(?m)^CREATE VIEW (?:IF NOT EXISTS )?(\w+)`), "CREATE VIEW ", true, ""},
		{regexp.MustCompile(`(?m)^DROP TABLE (?:IF NOT EXISTS )?(\w+);`), "DROP TABLE ", true, ";"},
		{regexp.MustCompile(`CREATE TRIGGER (?:IF NOT EXISTS )?(\w+)`), "CREATE TRIGGER ", false, ""},
	}
	texts := []string{
		"",
		"CREATE TABLE a (x);\nCREATE TABLE b_2 (y);",
		"  CREATE TABLE indented (x);\n-- CREATE TABLE commented\nCREATE TABLE t",
		"CREATE TABLE \nCREATE TABLE ok",
		"DROP TABLE x;\nDROP TABLE y ;\nDROP TABLE z;DROP TABLE w;\n DROP TABLE v;",
		"CREATE TRIGGER a AFTER\nCREATE TRIGGER IF NOT EXISTS b\nx CREATE TRIGGER c\nCREATE TRIGGER IF NOT EXISTS \nCREATE TRIGGER IF d",
		"CREATE VIEW v AS SELECT 1;\nCREATE VIEW w AS SELECT 2;",
	}
	files, err := filepath.Glob("../../schema/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("../../schema/*/*.sql")
	files = append(files, more...)
	more, _ = filepath.Glob("../../consumer/schema/*.sql")
	files = append(files, more...)
	if len(files) < 10 {
		t.Fatalf("found %d schema files", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		texts = append(texts, string(b))
	}
	found := 0
	for _, c := range cases {
		for i, text := range texts {
			var want []string
			for _, m := range c.re.FindAllStringSubmatch(text, -1) {
				want = append(want, m[1])
			}
			got := NamesAfter(text, c.prefix, c.lineStart, c.end)
			if !slices.Equal(got, want) {
				t.Errorf("%s in text %d: got %q, want %q", c.re, i, got, want)
			}
			found += len(got)
		}
	}
	if found < 50 {
		t.Errorf("only %d names found in all", found)
	}
}
