package bench

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// maxChangelogEntry is how long one entry of CHANGELOG.md may be, in
// characters with its line breaks folded: a line or two that says what a
// user notices. The measurements and the history of a change belong in its
// commit message, docs/ and BENCHMARKS.md.
const maxChangelogEntry = 300

// changelogKinds are Keep a Changelog's kinds of change, in its order.
var changelogKinds = []string{"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}

// TestChangelogMDShape: CHANGELOG.md has the Keep a Changelog shape
// (https://keepachangelog.com/en/1.1.0/): "# Changelog", then an
// "## [Unreleased]" section and one "## [X.Y.Z] - YYYY-MM-DD" per release,
// newest first; within each, only the kinds of change as "###" headings,
// each once and in order; every entry a short bullet under one of them; and
// its relative links name files (and headings) that exist.
func TestChangelogMDShape(t *testing.T) {
	page, err := os.ReadFile(filepath.Join(repoRoot, "CHANGELOG.md"))
	require.NoError(t, err)
	lines := strings.Split(string(page), "\n")
	require.Equal(t, "# Changelog", lines[0], "CHANGELOG.md starts with its title")

	release := regexp.MustCompile(`^## \[(Unreleased|\d+\.\d+\.\d+)\]( - (\d{4}-\d{2}-\d{2}))?$`)
	var (
		releases  []string
		lastDate  string
		kind      = -1 // index into changelogKinds of the section we are in
		entry     []string
		entryLine int
	)
	endEntry := func() {
		if entry == nil {
			return
		}
		text := strings.Join(strings.Fields(strings.Join(entry, " ")), " ")
		require.LessOrEqual(t, len([]rune(text)), maxChangelogEntry,
			"CHANGELOG.md:%d: an entry says in a line or two what a user notices; the details go to the commit message or docs/:\n%s", entryLine, text)
		entry = nil
	}
	for i, line := range lines[1:] {
		n := i + 2
		switch {
		case strings.HasPrefix(line, "#"):
			endEntry()
			switch {
			case strings.HasPrefix(line, "## "):
				m := release.FindStringSubmatch(line)
				require.NotNil(t, m, "CHANGELOG.md:%d: %q is not \"## [Unreleased]\" or \"## [X.Y.Z] - YYYY-MM-DD\"", n, line)
				if m[1] == "Unreleased" {
					require.Empty(t, releases, "CHANGELOG.md:%d: [Unreleased] comes first", n)
					require.Empty(t, m[3], "CHANGELOG.md:%d: [Unreleased] has no date", n)
				} else {
					require.NotEmpty(t, m[3], "CHANGELOG.md:%d: a release has its date", n)
					if lastDate != "" {
						require.LessOrEqual(t, m[3], lastDate, "CHANGELOG.md:%d: releases go newest first", n)
					}
					lastDate = m[3]
				}
				releases = append(releases, m[1])
				kind = -1
			case strings.HasPrefix(line, "### "):
				require.NotEmpty(t, releases, "CHANGELOG.md:%d: %q is outside a release", n, line)
				k := slices.Index(changelogKinds, strings.TrimPrefix(line, "### "))
				require.GreaterOrEqual(t, k, 0, "CHANGELOG.md:%d: %q: the kinds of change are %v", n, line, changelogKinds)
				require.Greater(t, k, kind, "CHANGELOG.md:%d: %q: each kind once, in the order %v", n, line, changelogKinds)
				kind = k
			default:
				t.Fatalf("CHANGELOG.md:%d: %q: only \"## \" releases and \"### \" kinds of change", n, line)
			}
		case strings.HasPrefix(line, "- "):
			endEntry()
			require.GreaterOrEqual(t, kind, 0, "CHANGELOG.md:%d: an entry sits under a kind of change (### Added, …)", n)
			entry, entryLine = []string{line}, n
		case strings.HasPrefix(line, "  ") && entry != nil:
			entry = append(entry, line)
		default:
			endEntry()
		}
	}
	endEntry()
	require.NotEmpty(t, releases, "CHANGELOG.md has an \"## [Unreleased]\" section")
	require.Equal(t, "Unreleased", releases[0], "CHANGELOG.md has an \"## [Unreleased]\" section first")

	for _, m := range regexp.MustCompile(`\]\(([^)#:]+)(?:#([^)]*))?\)`).FindAllStringSubmatch(string(page), -1) {
		target := filepath.Join(repoRoot, m[1])
		_, err := os.Stat(target)
		require.NoError(t, err, "CHANGELOG.md links to %s", m[1])
		if m[2] != "" {
			b, err := os.ReadFile(target)
			require.NoError(t, err)
			require.True(t, headingAnchors(string(b))[m[2]], "CHANGELOG.md links to %s#%s, which has no such heading", m[1], m[2])
		}
	}
}
