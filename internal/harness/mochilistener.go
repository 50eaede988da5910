package harness

import (
	"net"
	"sync"
	"time"
)

// ownedListener is an in-process broker's TCP listener, held by the
// harness so that Mochi.Stop ends every connection itself. mochi's Close,
// left to do it, races a connection being established (its WaitGroup's Add
// against Close's Wait: mochi-mqtt/server PR #508, a -race report) and
// waits forever for a client whose CONNECT it was still handling.
type ownedListener struct {
	net.Listener
	mu     sync.Mutex
	closed bool
	conns  map[*ownedConn]struct{}
}

func listenOwned(addr string) (*ownedListener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &ownedListener{Listener: ln, conns: map[*ownedConn]struct{}{}}, nil
}

// Accept hands mochi a connection the listener keeps track of; none once
// it is closed.
func (l *ownedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	oc := &ownedConn{Conn: c, l: l, entered: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	l.conns[oc] = struct{}{}
	return oc, nil
}

// end closes the listener, waits until mochi's goroutine for each
// connection has begun to read it (by then mochi counted it in the
// WaitGroup its Close waits on), and closes them all: Close then has no
// connection left to wait for, nor one coming.
func (l *ownedListener) end() {
	l.mu.Lock()
	l.closed = true
	conns := make([]*ownedConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	l.Listener.Close()
	for _, c := range conns {
		select {
		case <-c.entered:
		case <-time.After(5 * time.Second): // mochi dropped it unread
		}
		c.Close()
	}
}

// ownedConn is one of an ownedListener's connections.
type ownedConn struct {
	net.Conn
	l         *ownedListener
	enterOnce sync.Once
	entered   chan struct{} // closed at the first Read or at Close
}

func (c *ownedConn) Read(b []byte) (int, error) {
	c.enterOnce.Do(func() { close(c.entered) })
	return c.Conn.Read(b)
}

func (c *ownedConn) Close() error {
	c.enterOnce.Do(func() { close(c.entered) })
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
