package harness

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// FaultProxy is a TCP proxy between a client (the relay) and a broker that
// injects the faults of a bad network on command:
//
//   - cut: every connection is closed (FIN, or RST when asked);
//   - drop (blackhole): bytes in one direction are read and thrown away — a
//     PUBLISH that never arrives, a PUBACK that never returns — until the
//     fault ends with a cut. Dropping bytes desynchronises an MQTT stream,
//     so a connection that lost bytes is never let through afterwards;
//   - stall: no bytes move either way and nothing is closed; when the stall
//     ends, connections that were open before it resume with the bytes held
//     back (as TCP would retransmit them), while connections accepted during
//     it are closed unused (a real stall would have eaten their SYN);
//   - refuse (Down, then Up): the listener is closed (connection refused)
//     and every connection cut, until it listens again on the same address;
//   - bandwidth: bytes in one direction pass at most at a set rate (a slow
//     uplink). A shaped proxy (StartShapedProxy) keeps its socket buffers
//     as small as the kernel allows, so that the bytes it has not forwarded
//     yet are not acknowledged to the sender either: to the client, the
//     link is as slow as its rate, as a real one would be;
//   - latency: bytes in one direction arrive a set time after they were
//     sent, and what is still on the wire when the client's connection
//     closes is lost with it, as a device that loses power loses what it
//     had not yet sent. It is a delay line: every byte sent within the
//     last delay is on the wire at once. With a bandwidth, bytes leave at
//     the rate and arrive the latency after they left, as on a real link
//     (so 75 ms each way and 2 Mbit/s carry a window of messages per
//     150 ms round trip, at most 2 Mbit/s of them). Latency is set before
//     connections are made and does not combine with the other faults of
//     its direction (cut and refuse apart).
type FaultProxy struct {
	target string
	addr   string
	tight  bool // small receive buffers on both sides (StartShapedProxy)

	mu       sync.Mutex
	ln       net.Listener
	conns    map[*faultConn]struct{}
	dropUp   bool          // client -> broker bytes are thrown away
	dropDown bool          // broker -> client bytes are thrown away
	stall    chan struct{} // non-nil while stalled; closed when the stall ends
	closed   bool
	wg       sync.WaitGroup

	connected atomic.Int64 // connections accepted and dialled through
	dropped   [2]atomic.Int64
	rebinds   atomic.Int64    // failed attempts to listen again after refusing
	moved     [2]atomic.Int64 // bytes forwarded, per direction
	rate      [2]atomic.Int64 // bytes per second per direction; 0: unlimited
	latency   [2]atomic.Int64 // nanoseconds per direction; 0: none
}

// Dir is a direction through the proxy.
type Dir int

const (
	ToBroker Dir = 0 // client to broker
	ToClient Dir = 1 // broker to client
)

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

// StartFaultProxy listens on a free loopback port and forwards to target
// (host:port) until tb ends.
func StartFaultProxy(tb TB, target string) *FaultProxy {
	tb.Helper()
	return newFaultProxy(tb, target, false)
}

// StartShapedProxy is StartFaultProxy with bandwidth limits in bytes per
// second (up: client to broker; 0: unlimited) and small socket buffers.
func StartShapedProxy(tb TB, target string, up, down int64) *FaultProxy {
	tb.Helper()
	p := newFaultProxy(tb, target, true)
	p.SetRate(ToBroker, up)
	p.SetRate(ToClient, down)
	return p
}

// LaunchShapedProxy is StartShapedProxy for a program that is not a test
// (outboxlab bench): it lives until Close.
func LaunchShapedProxy(target string, up, down int64) (*FaultProxy, error) {
	p, err := launchFaultProxy(target, true)
	if err != nil {
		return nil, err
	}
	p.SetRate(ToBroker, up)
	p.SetRate(ToClient, down)
	return p, nil
}

// LaunchFaultProxy is StartFaultProxy for a program that is not a test: it
// lives until Close.
func LaunchFaultProxy(target string) (*FaultProxy, error) { return launchFaultProxy(target, false) }

// Close closes the listener and every connection, and waits for them.
func (p *FaultProxy) Close() { p.close() }

func newFaultProxy(tb TB, target string, tight bool) *FaultProxy {
	tb.Helper()
	p, err := launchFaultProxy(target, tight)
	must(tb, err, "fault proxy")
	tb.Cleanup(p.close)
	return p
}

func launchFaultProxy(target string, tight bool) (*FaultProxy, error) {
	p := &FaultProxy{target: target, tight: tight, conns: map[*faultConn]struct{}{}}
	ln, err := p.listen("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.addr = ln.Addr().String()
	if err := p.serve(ln); err != nil {
		return nil, err
	}
	return p, nil
}

// tightRcvBuf and tightMSS are what a shaped proxy's sockets ask for: the
// least receive buffer (the kernel rounds it up, to about 2 KiB) and
// segments of 536 bytes.
const tightRcvBuf, tightMSS = 1, 536

// smallRcvBuf asks for the smallest receive buffer and small segments. Set
// before the connection is made, the buffer bounds the window the peer is
// offered, so a peer's bytes wait in its own socket until the proxy reads
// them. The segments must fit that buffer: the receiver opens its window
// only for room of a segment's size, and loopback's segments are 64 KiB, so
// a peer that had filled the buffer was let through a few hundred bytes at
// a time, about four times a second (a relay's window of 64 crawled at 3
// messages a second; TestShapedProxyKeepsAWindowMoving). A bigger buffer
// would hold seconds of a slow link's bytes as gone that have not left
// (TestSlowLinkChargesNothing).
func smallRcvBuf(_, _ string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) {
		err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, tightRcvBuf)
		if err == nil {
			err = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, tightMSS)
		}
	}); cerr != nil {
		return cerr
	}
	return err
}

func (p *FaultProxy) listen(addr string) (net.Listener, error) {
	var lc net.ListenConfig
	if p.tight {
		lc.Control = smallRcvBuf // accepted connections inherit it
	}
	return lc.Listen(context.Background(), "tcp", addr)
}

func (p *FaultProxy) dial() (net.Conn, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	if p.tight {
		d.Control = smallRcvBuf
	}
	return d.Dial("tcp", p.target)
}

// SetRate limits one direction to bytesPerSec (0: unlimited), from the
// next read on.
func (p *FaultProxy) SetRate(dir Dir, bytesPerSec int64) { p.rate[dir].Store(bytesPerSec) }

// SetLatency delays the bytes of one direction by d on the connections
// made from now on.
func (p *FaultProxy) SetLatency(dir Dir, d time.Duration) { p.latency[dir].Store(int64(d)) }

// Addr is the proxy's host:port.
func (p *FaultProxy) Addr() string { return p.addr }

// URL is the proxy as a broker URL, tcp://host:port.
func (p *FaultProxy) URL() string { return "tcp://" + p.addr }

// Connected is how many connections the proxy accepted and dialled through.
func (p *FaultProxy) Connected() int64 { return p.connected.Load() }

// Moved is how many bytes the proxy forwarded in one direction.
func (p *FaultProxy) Moved(dir Dir) int64 { return p.moved[dir].Load() }

// Dropped is how many bytes the proxy threw away in one direction.
func (p *FaultProxy) Dropped(dir Dir) int64 { return p.dropped[dir].Load() }

// Rebinds is how many attempts to listen again after refusing failed.
func (p *FaultProxy) Rebinds() int64 { return p.rebinds.Load() }

func (p *FaultProxy) serve(ln net.Listener) error {
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

func (p *FaultProxy) handle(client net.Conn) {
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
	go func() { defer wg.Done(); p.pump(c, server, client, ToBroker) }()
	p.pump(c, client, server, ToClient)
	wg.Wait()
}

// pump copies src to dst, holding bytes back during a stall, throwing them
// away while its direction is blackholed and pacing them to its rate.
func (p *FaultProxy) pump(c *faultConn, dst, src net.Conn, dir Dir) {
	if d := time.Duration(p.latency[dir].Load()); d > 0 {
		p.pumpLate(c, dst, src, dir, d)
		return
	}
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

// pumpLate copies src to dst, each chunk delay after it left at its
// direction's rate (after it was read, with none); what is still on its way
// when src's connection ends is lost with it.
func (p *FaultProxy) pumpLate(c *faultConn, dst, src net.Conn, dir Dir, delay time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	wire := make(chan chunk, 4096)
	written := make(chan struct{})
	go func() {
		defer close(written)
		for ch := range wire {
			t := time.NewTimer(time.Until(ch.at)) // the link's latency
			select {
			case <-c.done:
				t.Stop()
				for range wire { // lost with the connection
				}
				return
			case <-t.C:
			}
			if _, err := dst.Write(ch.b); err != nil {
				for range wire {
				}
				return
			}
			p.moved[dir].Add(int64(len(ch.b)))
		}
	}()
	buf := make([]byte, 32<<10)
	var paced time.Time // when the bytes passed so far have left
	for {
		rate := p.rate[dir].Load()
		b := buf
		if rate > 0 {
			b = buf[:min(len(buf), max(int(rate/20), 1))] // as in pump
		}
		n, err := src.Read(b)
		if n > 0 {
			left := time.Now()
			// Waiting for the rate before the next read is what holds
			// the sender back: the delay line itself never fills.
			if rate > 0 && !p.pace(c, &paced, n, rate) {
				break
			}
			// The pace's credit may date bytes before they were read;
			// they cannot arrive before the latency after that.
			left = later(left, paced)
			wire <- chunk{b: append([]byte(nil), buf[:n]...), at: left.Add(delay)}
		}
		if err != nil {
			break
		}
	}
	c.close(false) // first: what is on the wire is lost, not written
	close(wire)
	<-written
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// pace waits until n more bytes may pass at rate bytes per second, paced
// being when the bytes before them could; false once c is closed. A little
// credit (50 ms) is kept, so that the proxy's own scheduling delays do not
// slow the link below its rate.
func (p *FaultProxy) pace(c *faultConn, paced *time.Time, n int, rate int64) bool {
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
func (p *FaultProxy) pass(c *faultConn) bool {
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

func (p *FaultProxy) dropping(dir Dir) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if dir == ToBroker {
		return p.dropUp
	}
	return p.dropDown
}

// cutLocked closes every connection; p.mu is held.
func (p *FaultProxy) cutLocked(rst bool) {
	for c := range p.conns {
		c.close(rst)
		delete(p.conns, c)
	}
}

// Cut closes every connection now (with RST if rst); new ones are
// accepted.
func (p *FaultProxy) Cut(rst bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutLocked(rst)
}

// Drop throws away the bytes flowing in one direction from now on, until
// EndDrop.
func (p *FaultProxy) Drop(dir Dir) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if dir == ToBroker {
		p.dropUp = true
	} else {
		p.dropDown = true
	}
}

// EndDrop ends every Drop and cuts every connection, all under one lock: a
// connection made after it is clean, every one that may have lost bytes is
// closed.
func (p *FaultProxy) EndDrop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropUp, p.dropDown = false, false
	p.cutLocked(false)
}

// Blackhole throws away the bytes flowing in one direction for d, then
// cuts every connection, which ends the fault.
func (p *FaultProxy) Blackhole(dir Dir, d time.Duration) {
	p.Drop(dir)
	time.Sleep(d) // the fault schedule
	p.EndDrop()
}

// StallFor stops every byte in both directions for d without closing
// anything, then lets the connections that predate the stall go on.
func (p *FaultProxy) StallFor(d time.Duration) {
	p.Stall()
	time.Sleep(d) // the fault schedule
	p.EndStall()
}

// Stall stops every byte in both directions, without closing anything,
// until EndStall.
func (p *FaultProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stall == nil {
		p.stall = make(chan struct{})
	}
}

// EndStall lets the connections that predate the stall go on, with the
// bytes held back, and closes those accepted during it.
func (p *FaultProxy) EndStall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stall
	if st == nil {
		return
	}
	for c := range p.conns {
		if c.bornIn == st {
			c.close(false)
			delete(p.conns, c)
		}
	}
	p.stall = nil
	close(st)
}

// Down closes the listener and every connection: connections are
// refused until Up.
func (p *FaultProxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.cutLocked(false)
}

// Up listens again on the same address.
func (p *FaultProxy) Up() error {
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

// Refuse refuses connections for d (Down), then listens again (Up).
func (p *FaultProxy) Refuse(d time.Duration) error {
	p.Down()
	time.Sleep(d) // the fault schedule
	return p.Up()
}

func (p *FaultProxy) close() {
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
