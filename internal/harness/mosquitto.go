package harness

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// MosquittoBinary finds the mosquitto executable in PATH or /usr/sbin
// (where Debian puts it, often outside a non-root PATH); "" if it is not
// installed.
func MosquittoBinary() string {
	if p, err := exec.LookPath("mosquitto"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"} {
		if executable(p) {
			return p
		}
	}
	return ""
}

// MosquittoOptions shape a Mosquitto.
type MosquittoOptions struct {
	// Bin is the executable; "" looks for it (MosquittoBinary).
	Bin string
	// Dir holds the configuration, the data and the log. StartMosquitto
	// uses a directory of the test's when it is "".
	Dir string
	// Config is the configuration after the listener line (which is
	// "listener <port> 127.0.0.1"); nil means PersistentConfig. The
	// harness adds "log_dest stderr" and, for root, "user root". It waits
	// for the log line that says Mosquitto is running, at log_type
	// information (on by default).
	Config []string
}

// PersistentConfig is a broker that loses nothing a test counts: a
// persistent session's queue survives a restart (Mosquitto keeps it in
// memory and writes it to dataDir on SIGTERM), and no QoS 1 message is
// dropped for a slow or disconnected subscriber.
func PersistentConfig(dataDir string) []string {
	return []string{
		"allow_anonymous true",
		"persistence true",
		"persistence_location " + dataDir + "/",
		"persistence_file mosquitto.db",
		// The default (1000) silently DROPS QoS 1 messages beyond it for a
		// slow or disconnected persistent subscriber.
		"max_queued_messages 0",
		"max_inflight_messages 100",
		// Without it Nagle's algorithm on loopback adds delayed-ACK stalls.
		"set_tcp_nodelay true",
		"log_timestamp_format %H:%M:%S",
	}
}

// Mosquitto is one Mosquitto broker owned by its caller: its own
// configuration, data directory and log, a loopback port of its own,
// started and stopped by PID. It can be stopped and started again on the
// same port.
type Mosquitto struct {
	bin, dir, conf, log string
	config              []string
	addr                string
	logf                func(format string, args ...any) // where a forced stop is told; nil: nowhere

	mu       sync.Mutex
	proc     *process
	logFrom  int64 // log offset at which the current process began
	restarts int
	killed   int // stops that needed SIGKILL (the database was not saved)
}

const mosquittoStopWait = 10 * time.Second

// LaunchMosquitto starts a Mosquitto on a free loopback port; Close stops
// it. Dir must be set.
func LaunchMosquitto(o MosquittoOptions) (*Mosquitto, error) {
	if o.Bin == "" {
		o.Bin = MosquittoBinary()
	}
	if o.Bin == "" {
		return nil, errors.New("mosquitto is not installed (looked in PATH and /usr/sbin): apt-get install -y mosquitto")
	}
	if o.Dir == "" {
		return nil, errors.New("harness: LaunchMosquitto needs a directory")
	}
	m := &Mosquitto{bin: o.Bin, dir: o.Dir, config: o.Config,
		conf: filepath.Join(o.Dir, "mosquitto.conf"), log: filepath.Join(o.Dir, "mosquitto.log")}
	if m.config == nil {
		data := filepath.Join(o.Dir, "data")
		if err := os.Mkdir(data, 0o700); err != nil {
			return nil, err
		}
		m.config = PersistentConfig(data)
	}
	// The port is free when we look; another process could take it before
	// Mosquitto binds it, so a failed bind is retried with a new port.
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var port int
		if port, err = FreePort(); err != nil {
			return nil, err
		}
		m.addr = loopback(port)
		if err = m.writeConfig(port); err != nil {
			return nil, err
		}
		if err = m.Start(); err == nil {
			return m, nil
		}
	}
	return nil, fmt.Errorf("mosquitto did not start: %w\n%s", err, m.LogTail(20))
}

// StartMosquitto starts a Mosquitto that lives as long as tb, skipping tb
// if Mosquitto is not installed. If tb fails, the end of the broker's log
// is logged; OUTBOX_MOSQUITTO_LOG=file keeps the whole log there.
func StartMosquitto(tb TB, o MosquittoOptions) *Mosquitto {
	tb.Helper()
	if o.Bin == "" {
		o.Bin = MosquittoBinary()
	}
	if o.Bin == "" {
		tb.Skipf("mosquitto is not installed (looked in PATH and /usr/sbin): apt-get install -y mosquitto")
	}
	if o.Dir == "" {
		o.Dir = tb.TempDir()
	}
	m, err := LaunchMosquitto(o)
	must(tb, err, "mosquitto")
	m.logf = tb.Logf
	tb.Cleanup(func() {
		m.Close()
		if keep := os.Getenv("OUTBOX_MOSQUITTO_LOG"); keep != "" {
			// For a look at Mosquitto's side after the run.
			if b, err := os.ReadFile(m.log); err == nil {
				_ = os.WriteFile(keep, b, 0o600)
			}
		}
		if tb.Failed() {
			tb.Logf("mosquitto log (%s), last lines:\n%s", m.log, m.LogTail(40))
		}
	})
	return m
}

func (m *Mosquitto) writeConfig(port int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "listener %d 127.0.0.1\n", port)
	for _, line := range m.config {
		b.WriteString(line + "\n")
	}
	b.WriteString("log_dest stderr\n")
	if os.Geteuid() == 0 {
		// Run as root, Mosquitto would switch to the "mosquitto" user, who
		// cannot write to a test's private temporary directory.
		b.WriteString("user root\n")
	}
	return os.WriteFile(m.conf, []byte(b.String()), 0o600)
}

// Addr is the broker's host:port.
func (m *Mosquitto) Addr() string { return m.addr }

// URL is tcp://host:port (ssl:// for a TLS listener is the caller's to
// write).
func (m *Mosquitto) URL() string { return "tcp://" + m.addr }

// Start runs Mosquitto and waits, bounded, until it accepts connections.
func (m *Mosquitto) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		return errors.New("mosquitto already running")
	}
	var from int64
	if fi, err := os.Stat(m.log); err == nil {
		from = fi.Size()
	}
	p, err := spawn("mosquitto", m.log, "", nil, m.bin, "-c", m.conf)
	if err != nil {
		return err
	}
	m.proc, m.logFrom = p, from

	deadline := time.Now().Add(10 * time.Second)
	for {
		if p.hasExited() {
			m.proc = nil
			return fmt.Errorf("mosquitto exited at start-up: %s", strings.TrimSpace(m.LogSince(from)))
		}
		// Ours, not someone else's: the process is alive, says it is
		// running, and the port accepts connections.
		if strings.Contains(m.LogSince(from), "running") && listening(m.addr) {
			return nil
		}
		if time.Now().After(deadline) {
			m.stopLocked()
			return fmt.Errorf("mosquitto did not accept connections on %s within 10 s", m.addr)
		}
		time.Sleep(2 * time.Millisecond) // polling, bounded by the deadline
	}
}

// Stop sends SIGTERM (Mosquitto saves its database and exits), then
// SIGKILL if it has not exited within a bounded wait.
func (m *Mosquitto) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopLocked()
}

func (m *Mosquitto) stopLocked() {
	if m.proc == nil {
		return
	}
	p := m.proc
	m.proc = nil
	if p.stop(mosquittoStopWait) {
		m.killed++
		if m.logf != nil {
			m.logf("mosquitto (pid %d) ignored SIGTERM for %s; killed it", p.cmd.Process.Pid, mosquittoStopWait)
		}
	}
}

// Close stops Mosquitto for good.
func (m *Mosquitto) Close() { m.Stop() }

// Restart stops Mosquitto, leaves it down for downFor (an outage of the
// broker itself), and starts it again on the same port.
func (m *Mosquitto) Restart(downFor time.Duration) error {
	m.Stop()
	time.Sleep(downFor) // the fault schedule: how long the broker is away
	m.mu.Lock()
	m.restarts++
	m.mu.Unlock()
	var err error
	// The same port: right after the old process released it, binding can
	// fail for a moment.
	for attempt := 0; attempt < 20; attempt++ {
		if err = m.Start(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// Restarts is how many times Restart ran.
func (m *Mosquitto) Restarts() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.restarts
}

// Killed is how many stops needed SIGKILL (so that Mosquitto did not save
// its database).
func (m *Mosquitto) Killed() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.killed
}

// LogSince returns the broker's log from byte offset off; LogSince(0) is
// all of it, over every restart.
func (m *Mosquitto) LogSince(off int64) string {
	f, err := os.Open(m.log)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// LogTail returns the last n lines of the broker's log.
func (m *Mosquitto) LogTail(n int) string { return tail(m.log, n) }

// Version is the version of this Mosquitto (MosquittoVersion).
func (m *Mosquitto) Version() string { return MosquittoVersion(m.bin) }

// MosquittoVersion is what "bin -h" says the version is; "" if it does not.
func MosquittoVersion(bin string) string {
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "mosquitto" && f[1] == "version" {
			return f[2]
		}
	}
	return ""
}

// MosquittoPasswordFile writes a Mosquitto password file in dir with one
// user, skipping tb if mosquitto_passwd is not installed.
func MosquittoPasswordFile(tb TB, dir, user, password string) string {
	tb.Helper()
	passwd, err := exec.LookPath("mosquitto_passwd")
	if err != nil {
		tb.Skipf("mosquitto_passwd is not installed: apt-get install -y mosquitto")
	}
	file := filepath.Join(dir, "passwords")
	must(tb, os.WriteFile(file, nil, 0o600), "password file")
	out, err := exec.Command(passwd, "-b", file, user, password).CombinedOutput()
	if err != nil {
		tb.Fatalf("mosquitto_passwd: %v: %s", err, out)
	}
	return file
}
