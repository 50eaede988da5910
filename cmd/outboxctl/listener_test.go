package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/monitor"
)

// The metrics listener of outboxctl relay: what net/http logs of it, and
// how many connections it may hold.

// TestMetricsListenerLogsInTheLogFormat: what net/http logs about the
// listener comes out as JSON under --log-format json, like every other
// line: here its accept failing for want of descriptors (a limit of 40, the
// relay needing about 25 of them, and 60 clients that send nothing).
func TestMetricsListenerLogsInTheLogFormat(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("lowers a limit with the shell's ulimit")
	}
	b := startBroker(t)
	path, _ := newOutbox(t)
	addr := freeAddr(t)
	cmd := limitedRelay(40, path, "--broker", "tcp://"+b.addr, "--client-id", "json-log-test",
		"--metrics-listen", addr, "--log-format", "json")
	var stderr harness.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	harness.Eventually(t, 15*time.Second, "ready", func() bool { return httpGet(addr, "/readyz") == http.StatusOK })
	conns := dialSlow(t, addr, 60)
	harness.Eventually(t, 10*time.Second, "the accept error logged", func() bool { return strings.Contains(stderr.String(), "Accept error") })
	for _, c := range conns {
		c.Close()
	}
	stopRelay(t, cmd, &stderr)
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		require.True(t, json.Valid([]byte(line)), "not JSON: %s", line)
	}
}

// TestMetricsListenerCannotStarveTheRelay: with 128 file descriptors and
// 200 clients that connect to the metrics listener and send nothing, the
// relay holds at most monitor.MaxConns of them open, and reconnects to its
// broker and publishes (the listener used to take every descriptor, and the
// reconnection failed with "too many open files").
func TestMetricsListenerCannotStarveTheRelay(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts the relay's descriptors in /proc")
	}
	const nofile, slow = 128, 200
	m := harness.StartMochi(t, harness.MochiOptions{})
	got := make(chan string, 10)
	require.NoError(t, m.Subscribe("shop/#", func(msg harness.Message) { got <- string(msg.Payload) }))
	path, ob := newOutbox(t)
	addr := freeAddr(t)
	cmd := limitedRelay(nofile, path, "--broker", "tcp://"+m.Addr(), "--client-id", "starve-test",
		"--metrics-listen", addr, "--backoff-max", "200ms")
	var stderr harness.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	harness.Eventually(t, 15*time.Second, "ready", func() bool { return httpGet(addr, "/readyz") == http.StatusOK })
	sockets := func() int {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
		require.NoError(t, err)
		n := 0
		for _, fd := range fds {
			if link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", cmd.Process.Pid, fd.Name())); err == nil && strings.HasPrefix(link, "socket:") {
				n++
			}
		}
		return n
	}
	t.Logf("sockets before: %d", sockets()) // the listener, the broker's connection

	m.Stop() // the relay reconnects from now on
	conns := dialSlow(t, addr, slow)
	harness.Eventually(t, 10*time.Second, "the listener full", func() bool { return sockets() > monitor.MaxConns })
	most := 0
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); {
		most = max(most, sockets())
	}
	t.Logf("sockets with %d slow clients: at most %d", slow, most)
	// The listener, MaxConns clients, and the relay's attempt to reach its
	// broker.
	require.LessOrEqual(t, most, 1+monitor.MaxConns+1, "the listener holds at most MaxConns connections")

	require.NoError(t, m.Resume())
	enqueue(t, ob, outbox.Message{Topic: "shop/1/sales", Payload: []byte(`{"n":1}`)})
	select {
	case <-got:
	case <-time.After(15 * time.Second):
		t.Fatalf("the relay did not publish after the broker came back: %s", stderr.String())
	}
	require.NotContains(t, stderr.String(), "too many open files")
	for _, c := range conns {
		c.Close()
	}
	stopRelay(t, cmd, &stderr)
}

// limitedRelay is outboxctl relay --db path args..., with at most nofile
// open files: a limit for this child alone, soft and hard (the Go runtime
// raises the soft one to the hard one).
func limitedRelay(nofile int, path string, args ...string) *exec.Cmd {
	return exec.Command("/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$@"`, nofile), "sh",
		binary, "relay", "--db", path}, args...)...)
}

// dialSlow opens n connections to addr that send nothing; they are closed
// when the test ends, if not before.
func dialSlow(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range n {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	return conns
}

func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := harness.FreePort()
	require.NoError(t, err)
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// httpGet is the status code of GET path from addr (0: no answer), on a
// connection of its own that it closes.
func httpGet(addr, path string) int {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0
	}
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
