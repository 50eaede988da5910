//go:build !linux

package outbox

// DefaultWallClockTrusted is false where this package cannot ask the system
// whether its wall clock is synchronized: the default of
// CommandOptions.WallClockTrusted.
func DefaultWallClockTrusted() bool { return false }
