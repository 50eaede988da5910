package outbox

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// faultProxy is a TCP proxy between a client (the relay) and a broker that
// injects the faults of a bad network on command:
//
//   - cut: every connection is closed (FIN, or RST when asked);
//   - blackhole: bytes in one direction are read and thrown away — a PUBLISH
//     that never arrives, a PUBACK that never returns — until the fault
//     ends with a cut. Dropping bytes desynchronises an MQTT stream, so a
//     connection that lost bytes is never let through afterwards;
//   - stall: no bytes move either way and nothing is closed; when the stall
//     ends, connections that were open before it resume with the bytes held
//     back (as TCP would retransmit them), while connections accepted during
//     it are closed unused (a real stall would have eaten their SYN);
//   - refuse: the listener is closed (connection refused) and every
//     connection cut, until it listens again on the same address;
//   - bandwidth: bytes in one direction pass at most at a set rate (a slow
//     uplink). A shaped proxy (startShapedProxy) keeps its socket buffers
//     as small as the kernel allows, so that the bytes it has not forwarded
//     yet are not acknowledged to the sender either: to the client, the
//     link is as slow as its rate, as a real one would be.
type faultProxy struct {
	target string
	addr   string
	tight  bool // small receive buffers on both sides (startShapedProxy)

	mu        sync.Mutex
	ln        net.Listener
	conns     map[*faultConn]struct{}
	dropUp    bool          // client -> broker bytes are thrown away
	dropDown  bool          // broker -> client bytes are thrown away
	stall     chan struct{} // non-nil while stalled; closed when the stall ends
	closed    bool
	wg        sync.WaitGroup
	connected atomic.Int64 // connections accepted and dialled through
	dropped   [2]atomic.Int64
	rebinds   atomic.Int64 // failed attempts to listen again after refusing

	moved [2]atomic.Int64 // bytes forwarded, per direction
	rate  [2]atomic.Int64 // bytes per second per direction; 0: unlimited
}

// faultConn is one proxied connection.
type faultConn struct {
	client, server net.Conn // server is nil for a connection born in a stall
	bornIn         chan struct{}
	done           chan struct{}
	once           sync.Once
}

func (c *faultConn) close(rst bool) {
	c.once.Do(func() {
		close(c.done)
		for _, n := range []net.Conn{c.client, c.server} {
			if n == nil {
				continue
			}
			if tc, ok := n.(*net.TCPConn); ok && rst {
				tc.SetLinger(0)
			}
			n.Close()
		}
	})
}

const (
	dirUp   = 0 // client to broker
	dirDown = 1 // broker to client
)

// startFaultProxy listens on a free loopback port and forwards to target
// until the test ends.
func startFaultProxy(t testing.TB, target string) *faultProxy {
	t.Helper()
	return newFaultProxy(t, target, false)
}

// startShapedProxy is startFaultProxy with bandwidth limits in bytes per
// second (up: client to broker; 0: unlimited) and small socket buffers.
func startShapedProxy(t testing.TB, target string, up, down int64) *faultProxy {
	t.Helper()
	p := newFaultProxy(t, target, true)
	p.setRate(dirUp, up)
	p.setRate(dirDown, down)
	return p
}

func newFaultProxy(t testing.TB, target string, tight bool) *faultProxy {
	t.Helper()
	p := &faultProxy{target: target, tight: tight, conns: map[*faultConn]struct{}{}}
	ln, err := p.listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.close)
	return p
}

// smallRcvBuf asks for the smallest receive buffer (the kernel rounds it
// up): set before the connection is made, it bounds the window the peer is
// offered, so a peer's bytes wait in its own socket until the proxy reads
// them.
func smallRcvBuf(_, _ string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) {
		err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1)
	}); cerr != nil {
		return cerr
	}
	return err
}

func (p *faultProxy) listen(addr string) (net.Listener, error) {
	var lc net.ListenConfig
	if p.tight {
		lc.Control = smallRcvBuf // accepted connections inherit it
	}
	return lc.Listen(context.Background(), "tcp", addr)
}

func (p *faultProxy) dial() (net.Conn, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	if p.tight {
		d.Control = smallRcvBuf
	}
	return d.Dial("tcp", p.target)
}

// setRate limits one direction to bytesPerSec (0: unlimited), from the next
// read on.
func (p *faultProxy) setRate(dir int, bytesPerSec int64) { p.rate[dir].Store(bytesPerSec) }

func (p *faultProxy) url() string { return "tcp://" + p.addr }

func (p *faultProxy) serve(ln net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		ln.Close()
		return errors.New("fault proxy closed")
	}
	p.ln = ln
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.handle(c) }()
		}
	}()
	return nil
}

func (p *faultProxy) handle(client net.Conn) {
	p.mu.Lock()
	stalled := p.stall
	p.mu.Unlock()
	var server net.Conn
	if stalled == nil {
		var err error
		server, err = p.dial()
		if err != nil { // the broker is down: the client sees the connection close
			client.Close()
			return
		}
	}
	c := &faultConn{client: client, server: server, bornIn: stalled, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.ln == nil || (stalled != nil && p.stall != stalled) {
		// The proxy went down (refusing), or the stall this connection was
		// born in ended meanwhile.
		p.mu.Unlock()
		c.close(false)
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	defer func() {
		c.close(false)
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	if server == nil {
		<-c.done // closed when the stall ends
		return
	}
	p.connected.Add(1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.pump(c, server, client, dirUp) }()
	p.pump(c, client, server, dirDown)
	wg.Wait()
}

// pump copies src to dst, holding bytes back during a stall, throwing them
// away while its direction is blackholed and pacing them to its rate.
func (p *faultProxy) pump(c *faultConn, dst, src net.Conn, dir int) {
	defer c.close(false)
	buf := make([]byte, 32<<10)
	var paced time.Time // when the bytes passed so far may have passed
	for {
		if !p.pass(c) {
			return
		}
		rate := p.rate[dir].Load()
		chunk := buf
		if rate > 0 {
			// A 20th of a second's worth at a time: what is read is out
			// of the sender's socket, so read no faster than the rate.
			chunk = buf[:min(len(buf), max(int(rate/20), 1))]
		}
		n, err := src.Read(chunk)
		if n > 0 {
			if rate > 0 && !p.pace(c, &paced, n, rate) {
				return
			}
			if !p.pass(c) {
				return
			}
			if p.dropping(dir) {
				p.dropped[dir].Add(int64(n))
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			} else {
				p.moved[dir].Add(int64(n))
			}
		}
		if err != nil {
			return
		}
	}
}

// pace waits until n more bytes may pass at rate bytes per second, paced
// being when the bytes before them could; false once c is closed. A little
// credit (50 ms) is kept, so that the proxy's own scheduling delays do not
// slow the link below its rate.
func (p *faultProxy) pace(c *faultConn, paced *time.Time, n int, rate int64) bool {
	now := time.Now()
	if floor := now.Add(-50 * time.Millisecond); paced.Before(floor) {
		*paced = floor
	}
	*paced = paced.Add(time.Duration(int64(n) * int64(time.Second) / rate))
	d := paced.Sub(now)
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d) // the link's pace
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.done:
		return false
	}
}

// pass waits while the proxy is stalled; false once c is closed.
func (p *faultProxy) pass(c *faultConn) bool {
	for {
		p.mu.Lock()
		st := p.stall
		p.mu.Unlock()
		if st == nil {
			select {
			case <-c.done:
				return false
			default:
				return true
			}
		}
		select {
		case <-st:
		case <-c.done:
			return false
		}
	}
}

func (p *faultProxy) dropping(dir int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if dir == dirUp {
		return p.dropUp
	}
	return p.dropDown
}

// cutLocked closes every connection; p.mu is held.
func (p *faultProxy) cutLocked(rst bool) {
	for c := range p.conns {
		c.close(rst)
		delete(p.conns, c)
	}
}

// cut closes every connection now; new ones are accepted.
func (p *faultProxy) cut(rst bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutLocked(rst)
}

// blackhole throws away the bytes flowing in one direction (dirUp or
// dirDown) for d, then cuts every connection, which ends the fault.
func (p *faultProxy) blackhole(dir int, d time.Duration) {
	p.mu.Lock()
	if dir == dirUp {
		p.dropUp = true
	} else {
		p.dropDown = true
	}
	p.mu.Unlock()
	time.Sleep(d) // the fault schedule
	p.mu.Lock()
	// Under one lock: a connection made after this is clean, every one
	// that may have lost bytes is closed.
	p.dropUp, p.dropDown = false, false
	p.cutLocked(false)
	p.mu.Unlock()
}

// stallFor stops every byte in both directions for d without closing
// anything, then lets the connections that predate the stall go on.
func (p *faultProxy) stallFor(d time.Duration) {
	st := make(chan struct{})
	p.mu.Lock()
	p.stall = st
	p.mu.Unlock()
	time.Sleep(d) // the fault schedule
	p.mu.Lock()
	for c := range p.conns {
		if c.bornIn == st {
			c.close(false)
			delete(p.conns, c)
		}
	}
	p.stall = nil
	close(st)
	p.mu.Unlock()
}

// refuse closes the listener and every connection for d (connections are
// refused), then listens again on the same address.
func (p *faultProxy) refuse(d time.Duration) error {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.cutLocked(false)
	p.mu.Unlock()
	time.Sleep(d) // the fault schedule
	var ln net.Listener
	var err error
	for attempt := 0; attempt < 100; attempt++ {
		if ln, err = p.listen(p.addr); err == nil {
			break
		}
		p.rebinds.Add(1)
		time.Sleep(10 * time.Millisecond) // the port was just released
	}
	if err != nil {
		return err
	}
	return p.serve(ln)
}

func (p *faultProxy) close() {
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	if p.stall != nil {
		close(p.stall)
		p.stall = nil
	}
	p.cutLocked(false)
	p.mu.Unlock()
	p.wg.Wait()
}
