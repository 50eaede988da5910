package outbox

import (
	"bufio"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

// wireConn is the connection paho writes to. It tells when each publish
// has been written and where it ends on the wire, so the relay can start a
// message's ack clock when its bytes have left rather than when it was
// handed over; and it makes paho's timeouts count from progress:
//
//   - paho puts a deadline of WriteTimeout on each publish's write; here it
//     is the longest the write may go without moving a byte (linkConn);
//   - paho counts PingTimeout from the return of the PINGREQ's write; here
//     that write returns once the PINGREQ has left, so a ping queued behind
//     a big message on a slow link does not time out while it waits;
//   - paho's Publish waits WriteTimeout for its network goroutine to take
//     the packet, which is busy for as long as the packet before takes to
//     write: expect lets at most two publishes wait unwritten (one being
//     written, one queued behind it), so Publish never waits for a write.
//
// Over TLS, paho writes to the tls.Conn inside (Conn), itself over the link.
type wireConn struct {
	net.Conn
	link        *linkConn
	pingTimeout time.Duration

	mu        sync.Mutex
	unwritten []*pubToken // handed to paho, in order, not yet written
	wrote     chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

// expect records that t is about to be handed to paho, once fewer than
// two publishes wait to be written; false if stop closed first.
func (w *wireConn) expect(t *pubToken, stop <-chan struct{}) bool {
	for {
		w.mu.Lock()
		if len(w.unwritten) < 2 {
			w.unwritten = append(w.unwritten, t)
			w.mu.Unlock()
			return true
		}
		w.mu.Unlock()
		select {
		case <-w.wrote:
		case <-stop:
			return false
		}
	}
}

// forget drops t, which paho refused without writing it.
func (w *wireConn) forget(t *pubToken) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, u := range w.unwritten {
		if u == t {
			w.unwritten = append(w.unwritten[:i], w.unwritten[i+1:]...)
			return
		}
	}
}

// Write writes one packet: paho writes each in one call, publishes from
// its network goroutine in the order they were handed over, pings from its
// keepalive goroutine.
func (w *wireConn) Write(b []byte) (int, error) {
	n, err := w.Conn.Write(b)
	if err != nil || len(b) == 0 {
		return n, err
	}
	switch b[0] >> 4 {
	case packets.Publish:
		end := w.link.written.Load()
		w.mu.Lock()
		var t *pubToken
		if len(w.unwritten) > 0 {
			t = w.unwritten[0]
			w.unwritten = append(w.unwritten[:0], w.unwritten[1:]...)
		}
		w.mu.Unlock()
		if t != nil {
			t.end.Store(end)
		}
		select {
		case w.wrote <- struct{}{}:
		default:
		}
	case packets.Pingreq:
		w.awaitGone(w.link.written.Load())
	}
	return n, err
}

// awaitGone waits until the bytes up to end have left, the link has moved
// nothing for PingTimeout (a stall: paho's PingTimeout then ends the
// connection), or the connection is closed.
func (w *wireConn) awaitGone(end int64) { w.link.awaitGone(end, w.pingTimeout, w.closed) }

// awaitGone waits until the bytes up to end have left, the link has moved
// nothing for timeout (a stall, which it records), or closed is closed. It
// polls: a ping is rare.
func (l *linkConn) awaitGone(end int64, timeout time.Duration, closed <-chan struct{}) {
	start := time.Now()
	delay := time.Millisecond
	for {
		gone, moved := l.progress()
		if gone >= end {
			return
		}
		if time.Since(later(start, moved)) >= timeout {
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

// SetWriteDeadline is paho's per-publish deadline: linkConn applies it as
// a deadline on progress.
func (w *wireConn) SetWriteDeadline(t time.Time) error {
	w.link.armed.Store(!t.IsZero())
	return nil
}

// SetDeadline is paho's bound on the MQTT handshake: a plain deadline.
func (w *wireConn) SetDeadline(t time.Time) error {
	w.link.armed.Store(false)
	return w.Conn.SetDeadline(t)
}

func (w *wireConn) Close() error {
	w.closeOnce.Do(func() { close(w.closed) })
	return w.Conn.Close()
}

// linkConn is the socket under paho (and under TLS). It counts the bytes
// written, tells how many have left — acknowledged by the peer's TCP where
// the kernel says (Linux), else handed to the kernel — and, while paho's
// write deadline is armed, fails a write only after WriteTimeout without
// any byte moving.
type linkConn struct {
	net.Conn
	raw     syscall.RawConn // nil: the bytes acknowledged cannot be asked
	base    int64           // bytes the peer had acknowledged before (a proxy's handshake)
	timeout time.Duration

	wmu     sync.Mutex // a write's rounds must not interleave with another's
	armed   atomic.Bool
	rbuf    *bufio.Reader // Read's; one reader at a time
	written atomic.Int64
	// stalled: the connection was given up on, or nearly, for moving no
	// bytes (see pubToken.classify). Progress clears it.
	stalled atomic.Bool

	pmu         sync.Mutex
	gone        int64     // bytes known to have left
	movedAt     time.Time // when gone last grew
	byAcks      bool      // gone is what the peer acknowledged
	writtenOnly bool      // the kernel does not say: gone is what was written
}

func newLinkConn(c net.Conn, timeout time.Duration) *linkConn {
	l := &linkConn{Conn: c, timeout: timeout, movedAt: time.Now()}
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			l.raw = raw
			l.base, _ = tcpBytesAcked(raw)
		}
	}
	if l.raw == nil {
		l.writtenOnly = true
	}
	return l
}

// Read reads through a buffer. A reader of MQTT packets (paho's, and
// mqtt5Conn's) asks for the first byte, then each byte of the length, then
// the rest: on the bare socket, three system calls for each PUBACK, while a
// window's worth of them waits in the kernel (mqtt5Conn's reads were 13 % of
// a CPU profile of a relay draining to the in-process broker, the writing
// of its backlog included).
func (l *linkConn) Read(b []byte) (int, error) {
	if l.rbuf == nil {
		l.rbuf = bufio.NewReaderSize(l.Conn, 4096)
	}
	return l.rbuf.Read(b)
}

func (l *linkConn) Write(b []byte) (int, error) {
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
func (l *linkConn) progress() (gone int64, movedAt time.Time) {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	g := l.gone // if the socket is closed, what was known stands
	if !l.writtenOnly {
		acked, ok := tcpBytesAcked(l.raw)
		switch {
		case ok && acked > l.base:
			g, l.byAcks = acked-l.base, true
		case !l.byAcks:
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
