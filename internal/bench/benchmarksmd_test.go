package bench

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

const repoRoot = "../.."

// TestBenchmarksMDIsShort: BENCHMARKS.md holds the current run, how to
// reproduce it and the targets; the history is in docs/bench (JSON) and in
// git, so that the page stays readable as runs accumulate.
func TestBenchmarksMDIsShort(t *testing.T) {
	fi, err := os.Stat(filepath.Join(repoRoot, "BENCHMARKS.md"))
	require.NoError(t, err)
	require.LessOrEqual(t, fi.Size(), int64(40*1024), "BENCHMARKS.md: move history to docs/bench or leave it to git")
}

// TestBenchmarksMDLinks: every link into BENCHMARKS.md's headings, from the
// repository's Markdown and Go files and from the page itself, names a
// heading it has, and the page's relative links name files that exist.
func TestBenchmarksMDLinks(t *testing.T) {
	page, err := os.ReadFile(filepath.Join(repoRoot, "BENCHMARKS.md"))
	require.NoError(t, err)
	anchors := headingAnchors(string(page))

	for _, m := range regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(string(page), -1) {
		require.True(t, anchors[m[1]], "BENCHMARKS.md links to #%s, which it has no heading for", m[1])
	}
	for _, m := range regexp.MustCompile(`\]\(([^)#:]+)(#[^)]*)?\)`).FindAllStringSubmatch(string(page), -1) {
		_, err := os.Stat(filepath.Join(repoRoot, m[1]))
		require.NoError(t, err, "BENCHMARKS.md links to %s", m[1])
	}

	into := regexp.MustCompile(`BENCHMARKS\.md#([A-Za-z0-9_-]+)`)
	links := 0
	err = filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && path != repoRoot {
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(path); ext != ".md" && ext != ".go" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range into.FindAllStringSubmatch(string(b), -1) {
			links++
			require.True(t, anchors[m[1]], "%s links to BENCHMARKS.md#%s, which has no such heading", path, m[1])
		}
		return nil
	})
	require.NoError(t, err)
	require.Positive(t, links, "the docs link into BENCHMARKS.md")
}

// headingAnchors returns the anchors GitHub gives a page's headings:
// lower case, punctuation dropped, spaces made hyphens, and a repeated
// one numbered.
func headingAnchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}
