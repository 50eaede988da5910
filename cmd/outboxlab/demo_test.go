package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDemo(t *testing.T) {
	r := lab(t, "demo", "--duration", "3s", "--rate", "100", "--outages", "1", "--outage-length", "1s")
	require.Equal(t, 0, r.Code, "%s\n%s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stdout, "lost                 0")
	require.Contains(t, r.Stdout, "out of order         0")
	require.Contains(t, r.Stdout, "-- broker down for 1s")
	require.Contains(t, r.Stdout, "-- broker back")
	require.Contains(t, r.Stdout, "OK: every committed order's event was delivered")
}
