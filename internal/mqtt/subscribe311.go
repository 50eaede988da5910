package mqtt

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	paho311 "github.com/eclipse/paho.mqtt.golang"
)

// The subscriber's MQTT 3.1.1 session: paho.mqtt.golang's client over a
// connection of ours (dial), clean session false, QoS 1, messages in order
// and acknowledged by hand, and no reconnection by paho: the subscriber
// reconnects, with backoff. paho's own pinger keeps the connection alive:
// the client has no way to replace it.

// disconnectWait bounds how long ending a session waits for paho to send
// the DISCONNECT and stop its goroutines; it takes longer only when a write
// is stuck.
const disconnectWait = time.Second

// session311 runs one MQTT 3.1.1 session (Subscribe).
func session311(ctx context.Context, a *Attempt, o *SessionOptions, handle func(context.Context, Message) bool) error {
	// paho's callback may be blocked handing over a message when the
	// session ends; cancelling sctx releases it.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := make(chan error, 1)
	// Messages are handed to one worker in arrival order: paho's callback
	// must not block on a slow handler (that would hold up its pings).
	queue := make(chan paho311.Message, 256)
	tlsCfg, err := tlsConfigFor(o.TLSConfig, o.TLSFiles)
	if err != nil {
		return err
	}
	po := paho311.NewClientOptions()
	po.AddBroker(a.URL.Scheme + "://" + a.URL.Host)
	po.SetClientID(o.ClientID)
	if o.Username != "" {
		po.SetUsername(o.Username)
		po.SetPassword(o.Password)
	}
	po.SetProtocolVersion(4)
	po.SetAutoReconnect(false)
	po.SetConnectRetry(false)
	po.SetConnectTimeout(o.ConnectTimeout)
	// SubscribeMultiple hands the SUBSCRIBE over for up to WriteTimeout
	// (30 s unless set), and waits that long for a connection that ended
	// as it began (a PUBLISH the check refused, right after the CONNACK),
	// unable to see the loss meanwhile. paho uses it elsewhere only for
	// a PUBLISH, which the subscriber never sends.
	po.SetWriteTimeout(o.ConnectTimeout)
	po.SetKeepAlive(o.KeepAlive)
	po.SetPingTimeout(o.PingTimeout)
	po.SetCleanSession(o.CleanSession)
	po.SetAutoAckDisabled(true)
	po.SetOrderMatters(true)
	handler := func(_ paho311.Client, m paho311.Message) {
		select {
		case queue <- m:
		case <-sctx.Done():
		}
	}
	// A resumed session's messages arrive before Subscribe returns; the
	// default handler takes them.
	po.SetDefaultPublishHandler(handler)
	po.SetConnectionLostHandler(func(_ paho311.Client, err error) {
		select {
		case lost <- err:
		default:
		}
	})
	// The connection is ours (dial: the proxy, TLS), so that ctx can end
	// the attempt.
	abort := connectAbort{dial: dialer{tls: tlsCfg, timeout: o.ConnectTimeout}, maxPacket: o.maxPacket()}
	po.SetCustomOpenConnectionFn(abort.open(sctx))
	c := paho311.NewClient(po)
	tok := c.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		// paho cannot abandon a connect under way (Disconnect waits for
		// it), and it waits for the CONNACK until ConnectTimeout; abort
		// closes the connection, which ends that wait at once. Subscribe
		// must not return before paho's goroutine has.
		<-tok.Done()
		abort.settle()
		return nil
	}
	abort.settle()
	if err := tok.Error(); err != nil {
		return fmt.Errorf("outbox: subscriber connect: %w", abort.because(err))
	}
	a.Connected()
	o.connected("3.1.1")
	defer func() {
		// Disconnect waits (up to the quiesce) for paho's goroutines to
		// end, and one of them may be blocked in the callback until sctx
		// ends.
		cancel()
		c.Disconnect(uint(disconnectWait / time.Millisecond))
	}()
	filters := make(map[string]byte, len(o.Topics))
	for _, t := range o.Topics {
		filters[t] = 1
	}
	st := c.SubscribeMultiple(filters, handler)
	// A resumed session's messages come before the SUBACK, as many as the
	// broker holds: they are handled while the SUBSCRIBE is under way.
	// Waiting for the SUBACK first would hang once more than the queue holds
	// had come: paho's one delivery goroutine, blocked handing them over,
	// is the one that would read the SUBACK.
	subscribed := st.Done()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-subscribed:
			subscribed = nil
			if err := st.Error(); err != nil {
				return fmt.Errorf("outbox: subscribe: %w", abort.because(err))
			}
			o.subscribed(a, "3.1.1")
		case err := <-lost:
			return fmt.Errorf("connection lost: %w", abort.because(err))
		case m := <-queue:
			if !handle(ctx, Message{Topic: m.Topic(), Payload: m.Payload(), ack: m}) {
				return nil
			}
		}
	}
}

// connectAbort opens a session's connection for paho and closes it if ctx
// ends while the connect is under way. paho reads the connection through a
// check that refuses a packet over maxPacket (checkedConn).
type connectAbort struct {
	dial      dialer
	maxPacket int

	mu   sync.Mutex
	stop func() bool   // unregisters the close
	done chan struct{} // closed once the close ran
	conn *checkedConn  // the connection opened, once it is
}

// open returns paho's function to open the network connection: the dialer
// with ctx, then a close registered on ctx until settle.
func (a *connectAbort) open(ctx context.Context) paho311.OpenConnectionFunc {
	return func(u *url.URL, _ paho311.ClientOptions) (net.Conn, error) {
		conn, err := a.dial.dial(ctx, u)
		if err != nil {
			return nil, err
		}
		done := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			defer close(done)
			conn.Close()
		})
		checked := &checkedConn{Conn: conn, check: publishCheck{max: a.maxPacket, v311: true}}
		a.mu.Lock()
		a.stop, a.done, a.conn = stop, done, checked
		a.mu.Unlock()
		return checked, nil
	}
}

// because is err, or what the connection's check refused it for
// (publishCheck.because).
func (a *connectAbort) because(err error) error {
	a.mu.Lock()
	conn := a.conn
	a.mu.Unlock()
	if conn == nil {
		return err
	}
	return conn.check.because(err)
}

// checkedConn is the 3.1.1 session's connection as paho reads it: each
// read goes through publishCheck first, so that a packet declared larger
// than the limit ends the connection (paho's connection lost, with the
// ProtocolError) before paho allocates its body.
type checkedConn struct {
	net.Conn
	check publishCheck // paho's one reader calls Read: no lock needed
}

func (c *checkedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if cerr := c.check.scan(p[:n]); cerr != nil {
		return 0, cerr
	}
	return n, err
}

// settle, called once the connect has ended, keeps the connection from
// being closed by ctx from now on (Disconnect ends it), or waits for a close
// already under way.
func (a *connectAbort) settle() {
	a.mu.Lock()
	stop, done := a.stop, a.done
	a.mu.Unlock()
	if stop != nil && !stop() {
		<-done
	}
}
