package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBenchCompare compares stored runs through the built binary: two
// files, several a side, and the arguments it refuses.
func TestBenchCompare(t *testing.T) {
	const dir = "../../docs/bench/2026-12-04-"
	r := lab(t, "bench", "compare", dir+"before-1.json", dir+"after-1.json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "| `enqueue_full_library_vs_raw` | ratio | 1.01 | 1.01 | 1.00 |")

	r = lab(t, "bench", "compare", dir+"before-1.json", dir+"before-2.json", "--", dir+"after-1.json", dir+"after-2.json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "| `drain_mochi_w16_library_msgs_per_s` | msg/s | 51,059, 56,648 | 62,614, 61,934 | 1.16 |")

	for _, args := range [][]string{
		{dir + "before-1.json"},
		{dir + "before-1.json", dir + "before-2.json", dir + "after-1.json"},
		{"--", dir + "after-1.json"},
		{dir + "before-1.json", "--"},
	} {
		r = lab(t, append([]string{"bench", "compare"}, args...)...)
		require.Equal(t, 2, r.Code, "%v: %s", args, r.Stderr)
		require.True(t, strings.HasPrefix(r.Stderr, "outboxlab: give two reports"), "%v: %q", args, r.Stderr)
	}
	r = lab(t, "bench", "compare", "../../go.mod", dir+"after-1.json")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "go.mod: not a bench report")
}
