//go:build linux

package mqtt

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// tcpAcknowledged reports how many bytes the peer of a TCP socket has
// acknowledged: bytes that have left this host. Linux counts them since
// 4.1; earlier kernels, and emulators that copy only part of TCP_INFO,
// report 0.
func tcpAcknowledged(raw syscall.RawConn) (int64, bool) {
	var n uint64
	var err error
	if cerr := raw.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		if info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			n = info.Bytes_acked
		}
	}); cerr != nil || err != nil {
		return 0, false
	}
	return int64(n), true
}
