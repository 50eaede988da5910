package outbox

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// runServer starts a broker binary owned by the test, logging to logFile,
// waits (bounded) until the log says ready and addr accepts connections, and
// stops it by PID when the test ends: SIGTERM, then SIGKILL.
func runServer(t *testing.T, name, logFile, ready, addr string, argv ...string) {
	t.Helper()
	logf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies without cleaning up, so does the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("%s log:\n%s", name, b)
		}
	})
	eventually(t, 15*time.Second, name+" accepting connections", func() bool {
		select {
		case <-exited:
			b, _ := os.ReadFile(logFile)
			t.Fatalf("%s exited: %s", name, b)
		default:
		}
		b, _ := os.ReadFile(logFile)
		if !strings.Contains(string(b), ready) {
			return false
		}
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// brokerCases runs the relay's core cases against a broker through p, a
// proxy in front of it, with sub subscribed to pos/# straight at the broker:
// 300 events in order; an outage in the middle with 100 more committed; a
// PUBACK withheld until the connection drops, after which the event is sent
// again and only then marked sent. It returns the duplicates sub saw.
func brokerCases(t *testing.T, ob *Outbox, r *Relay, p *harness.FaultProxy, sub *harness.Subscriber) (dups int) {
	t.Helper()
	for i := 0; i < 300; i++ {
		commitOrder(t, ob, "pos/orders", i)
	}
	eventually(t, 20*time.Second, "delivered", func() bool { return sub.Log.Unique() == 300 })

	// An outage: the relay cannot reach the broker while the till sells.
	p.Down()
	eventually(t, 5*time.Second, "relay notices", func() bool { s, _ := r.Stats(context.Background()); return !s.Connected })
	for i := 300; i < 400; i++ {
		commitOrder(t, ob, "pos/orders", i)
	}
	require.NoError(t, p.Up())
	eventually(t, 20*time.Second, "delivered after the outage", func() bool { return sub.Log.Unique() == 400 })

	// A PUBACK that never comes back, then the connection drops: resent,
	// never marked sent before.
	p.Drop(harness.ToClient)
	commitOrder(t, ob, "pos/orders", 400)
	eventually(t, 10*time.Second, "the broker has it", func() bool { return sub.Log.Unique() == 401 })
	state, _ := rowState(t, ob, 401)
	require.Equal(t, "pending", state, "not marked sent without its PUBACK")
	p.EndDrop()
	eventually(t, 10*time.Second, "acknowledged after the resend", func() bool { s, _ := rowState(t, ob, 401); return s == "sent" })

	got := sub.Log.Snapshot()
	require.Empty(t, got.Disorder, "first deliveries in commit order")
	require.Zero(t, got.DecodeErrors)
	require.Zero(t, countState(t, ob, "dead"))
	return got.Duplicates
}
