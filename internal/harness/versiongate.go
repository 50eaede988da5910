package harness

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// VersionGate stands in front of a broker and answers MQTT 5 CONNECTs as a
// broker without MQTT 5 would, in the way its mode says; 3.1.1 CONNECTs go
// through to the broker. It tests a client's choice of version.
type VersionGate struct {
	ln      net.Listener
	backend string
	mode    atomic.Value // a GateMode
	v5      atomic.Int64
	v311    atomic.Int64
	wg      sync.WaitGroup
}

// GateMode is how a VersionGate answers an MQTT 5 CONNECT.
type GateMode string

// The answers of a VersionGate to an MQTT 5 CONNECT.
const (
	GateConnack1  GateMode = "connack1"  // a 3.1.1 CONNACK, return code 1 (unacceptable protocol version)
	GateConnack84 GateMode = "connack84" // an MQTT 5 CONNACK, 0x84 (unsupported protocol version)
	GateClose     GateMode = "close"     // a close without a CONNACK, as some 3.1.1 brokers do
	GatePass      GateMode = "pass"      // through to the broker: it speaks 5 after all
)

// StartVersionGate starts a gate in front of the broker at backend
// (host:port), stopped when tb ends.
func StartVersionGate(tb TB, backend string, mode GateMode) *VersionGate {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(tb, err, "version gate: listen")
	g := &VersionGate{ln: ln, backend: backend}
	g.mode.Store(mode)
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g.wg.Add(1)
			go func() { defer g.wg.Done(); g.serve(c) }()
		}
	}()
	tb.Cleanup(func() { ln.Close(); g.wg.Wait() })
	return g
}

// URL is the gate's address as a broker URL.
func (g *VersionGate) URL() string { return "tcp://" + g.ln.Addr().String() }

// SetMode changes how the next MQTT 5 CONNECTs are answered.
func (g *VersionGate) SetMode(m GateMode) { g.mode.Store(m) }

// V5 is how many MQTT 5 CONNECTs the gate has seen.
func (g *VersionGate) V5() int64 { return g.v5.Load() }

// V311 is how many MQTT 3.1.1 CONNECTs the gate has seen.
func (g *VersionGate) V311() int64 { return g.v311.Load() }

func (g *VersionGate) serve(c net.Conn) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	// CONNECT: fixed header, remaining length (small), "\x00\x04MQTT", level.
	head := make([]byte, 2)
	if _, err := io.ReadFull(c, head); err != nil || head[1]&0x80 != 0 {
		return
	}
	body := make([]byte, head[1])
	if _, err := io.ReadFull(c, body); err != nil || len(body) < 7 {
		return
	}
	c.SetReadDeadline(time.Time{})
	if body[6] == 5 {
		g.v5.Add(1)
		switch g.mode.Load().(GateMode) {
		case GateConnack1:
			c.Write([]byte{0x20, 0x02, 0x00, 0x01})
			return
		case GateConnack84:
			c.Write([]byte{0x20, 0x03, 0x00, 0x84, 0x00})
			return
		case GateClose:
			return
		}
	} else {
		g.v311.Add(1)
	}
	b, err := net.Dial("tcp", g.backend)
	if err != nil {
		return
	}
	defer b.Close()
	if _, err := b.Write(append(head, body...)); err != nil {
		return
	}
	done := make(chan struct{})
	go func() { io.Copy(c, b); c.Close(); close(done) }()
	io.Copy(b, c)
	b.Close()
	<-done
}
