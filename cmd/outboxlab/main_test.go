package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/cli/clitest"
)

// binary is outboxlab built once for all tests (clitest.Main).
var binary string

func TestMain(m *testing.M) { os.Exit(clitest.Main(m, &binary)) }

func lab(t *testing.T, args ...string) clitest.Result {
	t.Helper()
	return clitest.Run(t, binary, args...)
}

func TestLabHelpHasExamples(t *testing.T) {
	for _, sub := range []string{"demo", "bench", "fleet"} {
		r := lab(t, sub, "--help")
		require.Equal(t, 0, r.Code, sub)
		require.Contains(t, r.Stdout, "Examples:", sub)
		require.Contains(t, r.Stdout, "outboxlab "+sub, sub)
	}
	r := lab(t, "--help")
	require.Equal(t, 0, r.Code)
	require.Contains(t, r.Stdout, "outboxctl", "the root's help points to the till's command")
}

// TestLabUsageErrors: outboxlab's command-line errors exit 2, named for it,
// and the till's commands are not here.
func TestLabUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--rate", "0"},
		{"demo", "--outages", "5", "--outage-length", "3s", "--duration", "15s"},
		{"demo", "extra"},
		{"bench", "--full", "--smoke"},
		{"relay", "--db", "till.db"},
		{"--log-format", "xml", "demo"},
	} {
		r := lab(t, args...)
		require.Equal(t, 2, r.Code, "%v: %s", args, r.Stderr)
		require.True(t, strings.HasPrefix(r.Stderr, "outboxlab: "), "%v: %q", args, r.Stderr)
	}
}
