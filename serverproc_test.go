package outbox

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
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
