package mqtt

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// countingConn counts the writes made on it.
type countingConn struct {
	net.Conn
	writes atomic.Int32
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// TestConnCoalescesAndReadsAcks: publishes handed over before the writer
// gets to them leave in one write, in order, each under its own packet id;
// PUBACKs that arrive in one piece complete their tokens, a success of
// either version and a refusal with or without properties.
func TestConnCoalescesAndReadsAcks(t *testing.T) {
	client, broker := net.Pipe()
	defer broker.Close()
	cc := &countingConn{Conn: client}
	l := newLink(cc, time.Second)
	var wg sync.WaitGroup
	c := newConn(l, l, false, &Options{Logger: slog.New(slog.DiscardHandler), Goroutines: &wg})
	const n = 10
	var toks []Token
	for i := 0; i < n; i++ {
		toks = append(toks, c.Publish("a/b", []byte{byte(i)}, &Properties{ContentType: "x"}))
	}
	c.start()
	for i := 0; i < n; i++ {
		first, body, err := readFrame(broker, nil, false)
		require.NoError(t, err)
		cp, err := decodeFrame(first, body)
		require.NoError(t, err)
		pb := cp.Content.(*packets.Publish)
		require.EqualValues(t, i+1, pb.PacketID)
		require.Equal(t, []byte{byte(i)}, pb.Payload)
		require.Equal(t, "x", pb.Properties.ContentType)
	}
	require.EqualValues(t, 1, cc.writes.Load(), "ten publishes handed over together, one write")
	// Each packet's end on the link is its own, not the write's.
	var end int64
	for i, tok := range toks {
		end += int64(len(appendPublish5(nil, "a/b", uint16(i+1), []byte{byte(i)}, &Properties{ContentType: "x"})))
		pt := tok.(*PublishToken)
		harness.Eventually(t, 10*time.Second, "the write's ends recorded", func() bool { return pt.end.Load() != 0 })
		require.Equal(t, end, pt.end.Load(), "packet %d", i+1)
	}

	var acks []byte
	acks = append(acks, 0x40, 2, 0, 1)    // 3.1.1, or MQTT 5 success without a reason code
	acks = append(acks, 0x40, 3, 0, 2, 0) // MQTT 5, success
	acks = append(acks, 0x40, 3, 0, 3, 0x87)
	refused := packets.NewControlPacket(packets.PUBACK)
	pa := refused.Content.(*packets.Puback)
	pa.PacketID, pa.ReasonCode = 4, 0x80
	pa.Properties = &packets.Properties{ReasonString: "quota spent"}
	var b bytes.Buffer
	_, err := refused.WriteTo(&b)
	require.NoError(t, err)
	acks = append(acks, b.Bytes()...)
	for id := 5; id <= n; id++ {
		acks = append(acks, 0x40, 2, 0, byte(id))
	}
	_, err = broker.Write(acks)
	require.NoError(t, err)
	for i, tok := range toks {
		select {
		case <-tok.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("token %d not completed", i+1)
		}
		switch i + 1 {
		case 3:
			require.Equal(t, &PubackError{Code: 0x87}, tok.Error())
			require.EqualError(t, tok.Error(), "not authorized (0x87)")
		case 4:
			require.Equal(t, &PubackError{Code: 0x80, Reason: "quota spent"}, tok.Error())
		default:
			require.NoError(t, tok.Error(), "token %d", i+1)
		}
	}
	broker.Close()
	wg.Wait()
}

// TestConnClassifiesOnce: Options.Classify sees the error of every token
// that fails, once, as it completes (a refusal, a packet over the broker's
// limit, a publish after the close, one in flight when the connection is
// lost), and never a success.
func TestConnClassifiesOnce(t *testing.T) {
	client, broker := net.Pipe()
	defer broker.Close()
	l := newLink(client, time.Second)
	var wg sync.WaitGroup
	var seen []error
	var mu sync.Mutex
	classify := func(err error) error {
		mu.Lock()
		seen = append(seen, err)
		mu.Unlock()
		return &classified{err}
	}
	c := newConn(l, l, false, &Options{Logger: slog.New(slog.DiscardHandler), Goroutines: &wg, Classify: classify})
	c.maxPacket = 64
	big := c.Publish("a/b", make([]byte, 100), nil)
	require.Equal(t, &classified{&PacketTooLargeError{Size: 1 + 1 + 2 + 3 + 2 + 1 + 100, Max: 64}}, big.Error())
	ok := c.Publish("a/b", []byte("1"), nil)
	refused := c.Publish("a/b", []byte("2"), nil)
	lost := c.Publish("a/b", []byte("3"), nil)
	c.start()
	for range 3 {
		_, _, err := readFrame(broker, nil, false)
		require.NoError(t, err)
	}
	_, err := broker.Write([]byte{0x40, 2, 0, 1, 0x40, 3, 0, 2, 0x97})
	require.NoError(t, err)
	<-refused.Done()
	require.NoError(t, ok.Error())
	require.Equal(t, &classified{&PubackError{Code: 0x97}}, refused.Error())
	broker.Close()
	<-lost.Done()
	var ce *classified
	require.ErrorAs(t, lost.Error(), &ce)
	require.ErrorIs(t, ce.err, ErrDisconnected)
	var se *StallError
	require.False(t, errors.As(ce.err, &se), "bytes moved: not a stall")
	after := c.Publish("a/b", []byte("4"), nil)
	require.ErrorAs(t, after.Error(), &ce)
	var nc *NotConnectedError
	require.ErrorAs(t, ce.err, &nc, "not connected, with why the connection ended")
	require.ErrorIs(t, ce.err, ErrNotConnected)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 4, "each failure classified once: %v", seen)
}

type classified struct{ err error }

func (e *classified) Error() string { return "classified: " + e.err.Error() }

// TestStallOnlyBeforeTheMessageLeft: when the connection is given up for
// moving no bytes, a publish whose packet had not left fails with a
// StallError; one whose packet had left does not (the broker may have it).
func TestStallOnlyBeforeTheMessageLeft(t *testing.T) {
	client, broker := net.Pipe()
	defer broker.Close()
	l := newLink(client, time.Second)
	c := newConn(l, l, false, &Options{Logger: slog.New(slog.DiscardHandler)})
	gone := &PublishToken{c: c, done: make(chan struct{})}
	gone.end.Store(10)
	stuck := &PublishToken{c: c, done: make(chan struct{})}
	stuck.end.Store(20)
	l.written.Store(10) // net.Pipe is no TCP socket: gone is what was written
	l.progress()
	cause := fmt.Errorf("%w: %w", ErrDisconnected, errors.New("write timeout"))
	require.Equal(t, cause, stuck.stall(cause), "not stalled: the connection's fault")
	l.stalled.Store(true) // no byte has moved since
	require.Equal(t, &StallError{Err: cause}, stuck.stall(cause))
	require.Equal(t, cause, gone.stall(cause))
	require.True(t, l.stalled.Load())
}
