// Package harness is the test harness of the outbox: everything a test, the
// benchmark or the fleet simulator needs around the library, in one place.
// It starts brokers owned by the caller on free loopback ports — Mosquitto,
// NATS Server (JetStream and its MQTT listener), RabbitMQ (rabbitmq_mqtt),
// ejabberd (mod_mqtt) and the in-process mochi — each with its own
// configuration and data directory, stopped by PID when its test ends; it
// makes test certificates (a PKI); it runs the fault proxy that stands
// between a client and a broker; and it has the MQTT subscriber that checks
// what a broker delivered.
//
// It knows nothing of the outbox package itself, so that the library's own
// white-box tests can import it: what is specific to the outbox's events (how
// to read an event's id and sequence) is passed in.
//
// Nothing here runs at import time, and nothing imports "testing": the
// functions that need a test take a TB, which *testing.T satisfies; the
// Launch functions that the benchmark and the simulator use return errors
// instead. A broker binary that is not installed skips the test with a line
// saying which package to install.
package harness

import (
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// TB is the part of testing.TB the harness uses.
type TB interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Skipf(format string, args ...any)
	Failed() bool
	TempDir() string
}

// must fails tb with what was being done if err is not nil.
func must(tb TB, err error, what string) {
	tb.Helper()
	if err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free when it looked.
// Another process could take it before the caller binds it; the launchers
// here retry with a new port when a bind fails.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freePorts returns n distinct free loopback ports.
func freePorts(tb TB, n int) []int {
	tb.Helper()
	seen := map[int]bool{}
	var ports []int
	for len(ports) < n {
		p, err := FreePort()
		must(tb, err, "free port")
		if !seen[p] {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	return ports
}

// loopback is 127.0.0.1:port.
func loopback(port int) string { return net.JoinHostPort("127.0.0.1", fmt.Sprint(port)) }

// listening says whether addr accepts a TCP connection now.
func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// Eventually polls cond until it holds, and fails tb if it does not within
// timeout.
func Eventually(tb TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond) // polling, bounded by the deadline
	}
}

// WaitFor polls cond until it holds (true) or d passes (false), for a
// caller that wants to say more than "timed out".
func WaitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond) // polling, bounded by the deadline
	}
	return true
}

// executable says whether p is a regular file someone may execute.
func executable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// tail returns the last n lines of the file, for a failure message.
func tail(file string, n int) string {
	b, _ := os.ReadFile(file)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
