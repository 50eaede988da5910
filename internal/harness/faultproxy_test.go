package harness

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sink is a TCP server that reads one connection and records when each
// byte count was reached.
type sink struct {
	ln net.Listener
	mu sync.Mutex
	n  int
	at []time.Time // at[i]: when byte i+1 arrived (the read that brought it)
	wg sync.WaitGroup
}

func startSink(t *testing.T) *sink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &sink{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			now := time.Now()
			s.mu.Lock()
			for i := 0; i < n; i++ {
				s.at = append(s.at, now)
			}
			s.n += n
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { ln.Close(); s.wg.Wait() })
	return s
}

func (s *sink) received() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// arrival is when byte i (1-based) arrived.
func (s *sink) arrival(i int) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at[i-1]
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(time.Millisecond) // polling a condition, with a deadline
	}
}

// TestShapedProxyLatencyIsADelayLine: 64 small writes, a millisecond
// apart, through a link of 75 ms one way each arrive about 75 ms after they
// were written, not one after the other (64 × 75 ms): a window of messages
// is in flight at once.
func TestShapedProxyLatencyIsADelayLine(t *testing.T) {
	s := startSink(t)
	p := StartShapedProxy(t, s.ln.Addr().String(), 250_000, 250_000)
	const delay, writes, size = 75 * time.Millisecond, 64, 40
	p.SetLatency(ToBroker, delay)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	wrote := make([]time.Time, writes)
	for i := range wrote {
		wrote[i] = time.Now()
		_, err := c.Write(make([]byte, size))
		require.NoError(t, err)
		time.Sleep(time.Millisecond) // the sender's pace: separate reads at the proxy
	}
	waitFor(t, 10*time.Second, "the writes arrived", func() bool { return s.received() == writes*size })
	var worst time.Duration
	for i, w := range wrote {
		took := s.arrival((i + 1) * size).Sub(w)
		require.GreaterOrEqual(t, took, delay, "write %d arrived before the link's latency", i)
		worst = max(worst, took)
	}
	t.Logf("%d writes over %s: each arrived %s to %s after it was written", writes,
		s.arrival(writes*size).Sub(wrote[0]).Round(time.Millisecond), delay, worst.Round(time.Millisecond))
	// Delayed one after the other, the last would take 64 × 75 ms; the
	// slack is for a loaded machine's scheduling.
	require.Less(t, worst, 2*delay, "the writes were delayed one after the other, not in flight together")
}

// TestShapedProxyLatencyAndRate: a link of 75 ms one way and 250,000 B/s
// (2 Mbit/s) takes about 1 s + 75 ms for 250,000 bytes: the latency is
// added to the time the bytes take at the link's rate, not instead of it.
func TestShapedProxyLatencyAndRate(t *testing.T) {
	s := startSink(t)
	const rate, delay, total = 250_000, 75 * time.Millisecond, 250_000
	p := StartShapedProxy(t, s.ln.Addr().String(), rate, rate)
	p.SetLatency(ToBroker, delay)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, total))
		wrote <- err
	}()
	waitFor(t, 10*time.Second, "the bytes arrived", func() bool { return s.received() == total })
	require.NoError(t, <-wrote)
	took := s.arrival(total).Sub(start)
	ideal := time.Duration(total)*time.Second/rate + delay
	t.Logf("%d bytes in %s (ideal %s); %d forwarded", total, took, ideal, p.Moved(ToBroker))
	require.GreaterOrEqual(t, s.arrival(1).Sub(start), delay, "bytes arrived before the link's latency")
	// The pace keeps 50 ms of credit: the link may run that much ahead.
	require.Greater(t, took, ideal-100*time.Millisecond, "the link was faster than its rate")
	require.Less(t, took, ideal+ideal/2, "the link was much slower than its rate")
	require.EqualValues(t, total, p.Moved(ToBroker))
}

// TestShapedProxyRoundTrip: with 75 ms each way, a request and its answer
// take 150 ms.
func TestShapedProxyRoundTrip(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // an echo server
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	defer func() { ln.Close(); wg.Wait() }()
	const delay = 75 * time.Millisecond
	c := dialCellular(t, ln.Addr().String(), delay)
	defer c.Close() // before the server is waited for
	for i := 0; i < 3; i++ {
		start := time.Now()
		_, err := c.Write([]byte("ping"))
		require.NoError(t, err)
		_, err = io.ReadFull(c, make([]byte, 4))
		require.NoError(t, err)
		rtt := time.Since(start)
		t.Logf("round trip %d: %s", i, rtt)
		require.GreaterOrEqual(t, rtt, 2*delay)
		require.Less(t, rtt, 3*delay, "more than the two directions' latency")
	}
}

// TestShapedProxyKeepsAWindowMoving: a window of 64 messages of 499 bytes,
// each answered with 4 bytes and replaced at once, the replacements of the
// answers that came together written together (as the relay writes), over
// 75 ms each way and 250,000 B/s: it runs near the window's limit (64 per
// round trip), as a link with such a window would. With the least receive
// buffer the kernel allows on the proxy's sockets, the sender's bytes came
// a few hundred at a time, about four times a second, once a write filled
// the buffer (the receiver waits for room of a segment's size before it
// opens its window, and loopback's segments are 64 KiB): 3 messages a
// second.
func TestShapedProxyKeepsAWindowMoving(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	const window, size, total = 64, 499, 1500
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the broker: an answer of 4 bytes for every message
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		msg := make([]byte, size)
		for {
			if _, err := io.ReadFull(c, msg); err != nil {
				return
			}
			if _, err := c.Write([]byte("ack!")); err != nil {
				return
			}
		}
	}()
	defer func() { ln.Close(); wg.Wait() }()
	const delay = 75 * time.Millisecond
	c := dialCellular(t, ln.Addr().String(), delay)
	defer c.Close() // before the server is waited for
	start := time.Now()
	_, err = c.Write(make([]byte, window*size))
	require.NoError(t, err)
	sent, acked := window, 0
	buf := make([]byte, 4*window)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	for acked < total {
		n, err := io.ReadAtLeast(c, buf, 4)
		require.NoError(t, err, "%d of %d answered after %s", acked, total, time.Since(start))
		for n%4 != 0 {
			m, err := c.Read(buf[n : n+4-n%4])
			require.NoError(t, err)
			n += m
		}
		acked += n / 4
		if more := min(n/4, total-sent); more > 0 {
			_, err := c.Write(make([]byte, more*size))
			require.NoError(t, err)
			sent += more
		}
	}
	took := time.Since(start)
	limit := float64(window) / (2 * delay).Seconds()
	rate := float64(total) / took.Seconds()
	t.Logf("%d messages in %s: %.0f/s, the window's limit %.0f/s", total, took.Round(time.Millisecond), rate, limit)
	require.Greater(t, rate, limit/2, "the link crawled")
}

// dialCellular connects to target through a shaped proxy of 250,000 B/s
// and delay each way; the caller closes the connection.
func dialCellular(t *testing.T, target string, delay time.Duration) net.Conn {
	t.Helper()
	p := StartShapedProxy(t, target, 250_000, 250_000)
	p.SetLatency(ToBroker, delay)
	p.SetLatency(ToClient, delay)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	return c
}
