package fleet

import (
	"io"
	"net"
	"sync"
	"time"
)

// gate stands between the devices and the broker. It counts every
// connection attempt (the load a broker sees when a fleet reconnects) and
// can take the broker away: cut every connection and turn each new one
// away at once, as a broker that is down behind a load balancer would.
type gate struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	closed   bool
	down     bool
	attempts []time.Time
	open     int                   // piped connections now up
	conns    map[net.Conn]struct{} // both ends of every piped connection
	wg       sync.WaitGroup
}

func startGate(target string) (*gate, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &gate{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	g.wg.Add(1)
	go g.accept()
	return g, nil
}

func (g *gate) url() string { return "tcp://" + g.ln.Addr().String() }

func (g *gate) accept() {
	defer g.wg.Done()
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.mu.Lock()
		g.attempts = append(g.attempts, time.Now())
		turnAway := g.down || g.closed
		g.mu.Unlock()
		if turnAway {
			c.Close()
			continue
		}
		g.wg.Add(1)
		go g.pipe(c)
	}
}

func (g *gate) pipe(c net.Conn) {
	defer g.wg.Done()
	up, err := net.DialTimeout("tcp", g.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	g.mu.Lock()
	if g.down || g.closed {
		g.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	g.conns[c], g.conns[up] = struct{}{}, struct{}{}
	g.open++
	g.mu.Unlock()

	done := make(chan struct{}, 2)
	copyHalf := func(dst, src net.Conn) {
		// Small buffers: the simulation holds hundreds of these.
		buf := make([]byte, 4096)
		io.CopyBuffer(dst, src, buf)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go copyHalf(up, c)
	go copyHalf(c, up)
	<-done
	<-done
	g.mu.Lock()
	delete(g.conns, c)
	delete(g.conns, up)
	g.open--
	g.mu.Unlock()
}

// cut takes the broker away until restore.
func (g *gate) cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = true
	for c := range g.conns {
		c.Close()
	}
}

func (g *gate) restore() {
	g.mu.Lock()
	g.down = false
	g.mu.Unlock()
}

// connected is how many devices have a connection through the gate.
func (g *gate) connected() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

// attemptsSince returns the connection attempts at or after t.
func (g *gate) attemptsSince(t time.Time) []time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []time.Time
	for _, a := range g.attempts {
		if !a.Before(t) {
			out = append(out, a)
		}
	}
	return out
}

func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.ln.Close()
	g.wg.Wait()
}
