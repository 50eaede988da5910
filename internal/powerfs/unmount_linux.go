package powerfs

import "syscall"

// childAttr has the kernel kill the helper when the test binary dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// detach takes away a mount the helper left behind (if it was killed): a
// dead FUSE mount answers "transport endpoint is not connected" until it
// is unmounted.
func detach(mountpoint string) {
	_ = syscall.Unmount(mountpoint, syscall.MNT_DETACH)
}
