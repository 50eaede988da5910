package natsjs

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSubject(t *testing.T) {
	for topic, want := range map[string]string{
		"pos/a":        "pos.a",
		"pos":          "pos",
		"/":            "/./",
		"//":           "/././",
		"/pos":         "/.pos",
		"pos/":         "pos./",
		"pos//a":       "pos./.a",
		"pos/v1.2/a":   "pos.v1//2.a",
		"//pos/a":      "/./.pos.a",
		"pos/a*b/c>d":  "pos.a*b.c>d",
		"pos/é/ü":      "pos.é.ü",
		"till-1/sales": "till-1.sales",
	} {
		got, err := Subject(topic)
		if err != nil || got != want {
			t.Errorf("Subject(%q) = %q, %v; want %q", topic, got, err, want)
		}
	}
	for _, topic := range []string{"", "pos/+", "pos/#", "a+b", "pos/*", "pos/>", ">", "pos/a b", "pos/a\tb", "pos/a\nb", "pos/a\rb", "pos/\x00", "pos/\x7f"} {
		if got, err := Subject(topic); err == nil {
			t.Errorf("Subject(%q) = %q, want an error", topic, got)
		}
	}
}

// FuzzSubject checks that every subject Subject returns is one NATS takes
// for a publish (non-empty tokens, no white space or control characters,
// no wildcard token) and that two topics never share one.
func FuzzSubject(f *testing.F) {
	for _, s := range []string{"pos/a", "/", "//", "/a/", "a.b", "a b", "a/*", "a//b", "a/./b", "a%20b"} {
		f.Add(s, s+"/x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		sa, errA := Subject(a)
		sb, errB := Subject(b)
		for _, c := range []struct {
			topic, subject string
			err            error
		}{{a, sa, errA}, {b, sb, errB}} {
			if c.err != nil {
				continue
			}
			if c.subject == "" || strings.ContainsAny(c.subject, " \t\r\n\x00\x7f") {
				t.Fatalf("Subject(%q) = %q: not a subject", c.topic, c.subject)
			}
			for _, tok := range strings.Split(c.subject, ".") {
				if tok == "" || tok == "*" || tok == ">" {
					t.Fatalf("Subject(%q) = %q: token %q", c.topic, c.subject, tok)
				}
			}
			if utf8.ValidString(c.topic) != utf8.ValidString(c.subject) {
				t.Fatalf("Subject(%q) = %q changed UTF-8 validity", c.topic, c.subject)
			}
		}
		if errA == nil && errB == nil && a != b && sa == sb {
			t.Fatalf("Subject(%q) = Subject(%q) = %q", a, b, sa)
		}
	})
}
