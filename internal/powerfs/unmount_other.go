//go:build !linux

package powerfs

import "syscall"

func childAttr() *syscall.SysProcAttr { return nil }

func detach(string) {}
