package mqtt

import (
	"bufio"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/edgeoutbox/outbox/internal/wait"
)

// link is the socket under the publish connection (and under TLS). It
// counts the bytes written and tells how many have left this host: the
// bytes acknowledged by the peer's TCP where the kernel says (Linux), else
// those handed to the kernel. While a publish's write is armed, it fails
// the write only after WriteTimeout without any byte moving, so that a slow
// link is not taken for a broken one.
type link struct {
	net.Conn
	raw     syscall.RawConn // nil: the bytes acknowledged by TCP cannot be asked
	base    int64           // bytes TCP had acknowledged before (a proxy's handshake)
	timeout time.Duration

	wmu     sync.Mutex // a write's rounds must not interleave with another's
	armed   atomic.Bool
	rbuf    *bufio.Reader // Read's; one reader at a time
	written atomic.Int64
	// stalled: the connection was given up on, or nearly, for moving no
	// bytes (see PublishToken's stall check). progress clears it.
	stalled atomic.Bool

	pmu         sync.Mutex
	gone        int64     // bytes known to have left
	movedAt     time.Time // when gone last grew
	byTCP       bool      // gone is what TCP acknowledged
	writtenOnly bool      // the kernel does not say: gone is what was written
}

func newLink(c net.Conn, timeout time.Duration) *link {
	l := &link{Conn: c, timeout: timeout, movedAt: time.Now()}
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			l.raw = raw
			l.base, _ = tcpAcknowledged(raw)
		}
	}
	if l.raw == nil {
		l.writtenOnly = true
	}
	return l
}

// Read reads through a buffer. A reader of MQTT packets (the connection's)
// asks for the first byte, then each byte of the length, then the rest: on
// the bare socket that is three system calls for each PUBACK, while a
// window's worth of them waits in the kernel.
func (l *link) Read(b []byte) (int, error) {
	if l.rbuf == nil {
		l.rbuf = bufio.NewReaderSize(l.Conn, 4096)
	}
	return l.rbuf.Read(b)
}

func (l *link) Write(b []byte) (int, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if !l.armed.Load() {
		n, err := l.Conn.Write(b)
		l.written.Add(int64(n))
		return n, err
	}
	defer l.Conn.SetWriteDeadline(time.Time{})
	n := 0
	for {
		round := time.Now()
		l.Conn.SetWriteDeadline(round.Add(l.timeout))
		m, err := l.Conn.Write(b[n:])
		n += m
		l.written.Add(int64(m))
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		if m == 0 {
			// The kernel took nothing, yet bytes may have left: it frees
			// the send buffer in lumps.
			if _, moved := l.progress(); moved.After(round) {
				continue
			}
			l.stalled.Store(true)
			return n, err
		}
		// Bytes moved within the deadline: a slow link, not a broken one.
	}
}

// progress reports how many bytes are known to have left and when that
// last grew.
func (l *link) progress() (gone int64, movedAt time.Time) {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	g := l.gone // if the socket is closed, what was known stands
	if !l.writtenOnly {
		n, ok := tcpAcknowledged(l.raw)
		switch {
		case ok && n > l.base:
			g, l.byTCP = n-l.base, true
		case !l.byTCP:
			// Asked after the CONNECT was acknowledged, yet nothing: the
			// kernel does not count (before Linux 4.1, or emulated).
			l.writtenOnly = true
		}
	}
	if l.writtenOnly {
		g = l.written.Load()
	}
	if g > l.gone {
		l.gone, l.movedAt = g, time.Now()
		l.stalled.Store(false)
	}
	return l.gone, l.movedAt
}

// awaitGone waits until the bytes up to end have left, the link has moved
// nothing for timeout (a stall, which it records), or closed is closed. It
// polls: a ping is rare.
func (l *link) awaitGone(end int64, timeout time.Duration, closed <-chan struct{}) {
	start := time.Now()
	delay := time.Millisecond
	for {
		gone, moved := l.progress()
		if gone >= end {
			return
		}
		if time.Since(wait.Later(start, moved)) >= timeout {
			l.stalled.Store(true)
			return
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-closed:
			t.Stop()
			return
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}
