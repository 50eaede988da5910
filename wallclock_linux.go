//go:build linux

package outbox

import "syscall"

// DefaultWallClockTrusted reports whether the kernel says the wall clock is
// synchronized (adjtimex's state is not TIME_ERROR, which it is until NTP,
// chrony or systemd-timesyncd has disciplined it): the default of
// CommandOptions.WallClockTrusted.
func DefaultWallClockTrusted() bool {
	var tx syscall.Timex
	state, err := syscall.Adjtimex(&tx)
	return err == nil && state != timeError
}

// timeError is adjtimex's TIME_ERROR: the clock is not synchronized.
const timeError = 5
