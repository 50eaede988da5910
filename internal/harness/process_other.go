//go:build !linux

package harness

import "syscall"

// childAttr is nothing off Linux: there is no parent-death signal, and the
// harness's cleanups stop its children by PID.
func childAttr() *syscall.SysProcAttr { return nil }
