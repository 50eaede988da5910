package harness

import "syscall"

// childAttr has the kernel kill a child when the test binary dies, so that
// no broker outlives a crashed test.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
