//go:build linux

package outbox

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// This file runs a real Mosquitto (the Debian package) for the tests that
// need one, and a persistent-session subscriber connected to it directly.

// mosquittoBinary finds the mosquitto executable in PATH or /usr/sbin (where
// Debian puts it, often outside a non-root PATH); "" if it is not installed.
func mosquittoBinary() string {
	if p, err := exec.LookPath("mosquitto"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// mosquitto is one Mosquitto broker owned by a test: its own config, data
// directory and log in t.TempDir(), a loopback port of its own, started and
// stopped by PID. Persistence is on, and Mosquitto saves its database when
// it is stopped with SIGTERM, so a persistent session (and the messages
// queued for it) survives restart.
type mosquitto struct {
	t    testing.TB
	bin  string
	dir  string
	conf string
	log  string
	port int
	addr string

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{} // closed once the current process has been reaped
	logFrom  int64         // log offset at which the current process began
	restarts int
	killed   int // stops that needed SIGKILL (the database was not saved)
}

const mosquittoStopWait = 10 * time.Second

// startMosquitto starts a fresh Mosquitto on a free 127.0.0.1 port and stops
// it when the test ends. It skips the test if Mosquitto is not installed.
func startMosquitto(t testing.TB) *mosquitto {
	t.Helper()
	bin := mosquittoBinary()
	if bin == "" {
		t.Skip("mosquitto is not installed (looked in PATH and /usr/sbin): apt-get install -y mosquitto")
	}
	dir := t.TempDir()
	m := &mosquitto{t: t, bin: bin, dir: dir, conf: filepath.Join(dir, "mosquitto.conf"), log: filepath.Join(dir, "mosquitto.log")}
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.stop()
		if keep := os.Getenv("OUTBOX_MOSQUITTO_LOG"); keep != "" {
			// For a look at Mosquitto's side after the run.
			if b, err := os.ReadFile(m.log); err == nil {
				_ = os.WriteFile(keep, b, 0o600)
			}
		}
		if t.Failed() {
			t.Logf("mosquitto log (%s), last lines:\n%s", m.log, m.logTail(40))
		}
	})
	// The port is free when we look; another process could take it before
	// Mosquitto binds it, so a failed bind is retried with a new port.
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		m.port, err = freeLoopbackPort()
		if err != nil {
			t.Fatal(err)
		}
		m.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port))
		if err = m.writeConfig(); err != nil {
			t.Fatal(err)
		}
		if err = m.start(); err == nil {
			return m
		}
		t.Logf("mosquitto did not start on port %d, trying another: %v", m.port, err)
	}
	t.Fatalf("mosquitto did not start: %v\n%s", err, m.logTail(20))
	return nil
}

func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (m *mosquitto) writeConfig() error {
	var b strings.Builder
	fmt.Fprintf(&b, "listener %d 127.0.0.1\n", m.port)
	b.WriteString("allow_anonymous true\n")
	// A persistent session's queue must survive a restart: Mosquitto keeps
	// it in memory and writes it to the data directory on SIGTERM.
	b.WriteString("persistence true\n")
	fmt.Fprintf(&b, "persistence_location %s/\n", filepath.Join(m.dir, "data"))
	b.WriteString("persistence_file mosquitto.db\n")
	// The default (1000) silently DROPS QoS 1 messages beyond it for a slow
	// or disconnected persistent subscriber; a test of zero loss needs none.
	b.WriteString("max_queued_messages 0\n")
	b.WriteString("max_inflight_messages 100\n")
	// Without it Nagle's algorithm on loopback adds delayed-ACK stalls.
	b.WriteString("set_tcp_nodelay true\n")
	b.WriteString("log_dest stderr\n")
	b.WriteString("log_timestamp_format %H:%M:%S\n")
	if os.Geteuid() == 0 {
		// Run as root, Mosquitto would switch to the "mosquitto" user, who
		// cannot write to the test's private temporary directory.
		b.WriteString("user root\n")
	}
	return os.WriteFile(m.conf, []byte(b.String()), 0o600)
}

// start runs Mosquitto and waits, bounded, until it accepts connections.
func (m *mosquitto) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return errors.New("mosquitto already running")
	}
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own copy
	fi, err := logf.Stat()
	if err != nil {
		return err
	}
	cmd := exec.Command(m.bin, "-c", m.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies without cleaning up, so does Mosquitto.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	m.cmd, m.exited, m.logFrom = cmd, exited, fi.Size()

	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			m.cmd = nil
			return fmt.Errorf("mosquitto exited at start-up: %s", strings.TrimSpace(m.logSince(m.logFrom)))
		default:
		}
		// Ours, not someone else's: the process is alive, says it is
		// running, and the port accepts connections.
		if strings.Contains(m.logSince(m.logFrom), "running") {
			if c, err := net.DialTimeout("tcp", m.addr, 100*time.Millisecond); err == nil {
				c.Close()
				return nil
			}
		}
		if time.Now().After(deadline) {
			m.stopLocked()
			return fmt.Errorf("mosquitto did not accept connections on %s within 10 s", m.addr)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// stop sends SIGTERM (Mosquitto saves its database and exits), then SIGKILL
// if it has not exited within a bounded wait.
func (m *mosquitto) stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopLocked()
}

func (m *mosquitto) stopLocked() {
	if m.cmd == nil {
		return
	}
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return
	case <-time.After(mosquittoStopWait):
	}
	m.killed++
	m.t.Logf("mosquitto (pid %d) ignored SIGTERM for %s; killing it", cmd.Process.Pid, mosquittoStopWait)
	_ = cmd.Process.Kill()
	<-exited
}

// restart stops Mosquitto, leaves it down for downFor (an outage of the
// broker itself), and starts it again on the same port.
func (m *mosquitto) restart(downFor time.Duration) error {
	m.stop()
	time.Sleep(downFor) // the fault schedule: how long the broker is away
	m.mu.Lock()
	m.restarts++
	m.mu.Unlock()
	var err error
	// The same port: right after the old process released it, binding can
	// fail for a moment.
	for attempt := 0; attempt < 20; attempt++ {
		if err = m.start(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

func (m *mosquitto) pid() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

func (m *mosquitto) logSince(off int64) string {
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

func (m *mosquitto) logTail(n int) string {
	lines := strings.Split(strings.TrimRight(m.logSince(0), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// eventLog records what a subscriber received: every delivery, the first
// delivery of each event id in order, duplicates and decoding errors.
type eventLog struct {
	mu         sync.Mutex
	deliveries int
	seen       map[string]int64 // id -> sequence
	firstSeqs  []int64
	dups       int
	decodeErrs int
	disorder   []string // first deliveries that broke commit order
	lastFirst  time.Time
}

func newEventLog() *eventLog { return &eventLog{seen: map[string]int64{}} }

func (l *eventLog) add(payload []byte) {
	ev, err := DecodeEvent(payload)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deliveries++
	if err != nil {
		l.decodeErrs++
		return
	}
	if _, ok := l.seen[ev.ID]; ok {
		l.dups++
		return
	}
	l.seen[ev.ID] = ev.Sequence
	if n := len(l.firstSeqs); n > 0 && ev.Sequence <= l.firstSeqs[n-1] && len(l.disorder) < 20 {
		l.disorder = append(l.disorder, fmt.Sprintf("seq %d first delivered after seq %d", ev.Sequence, l.firstSeqs[n-1]))
	}
	l.firstSeqs = append(l.firstSeqs, ev.Sequence)
	l.lastFirst = time.Now()
}

func (l *eventLog) unique() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.firstSeqs)
}

func (l *eventLog) has(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.seen[id]
	return ok
}

// persistentSubscriber is a paho client with a fixed client id and
// CleanSession false, subscribed at QoS 1, so the broker queues what it
// misses while disconnected. It reconnects by itself (not with paho's
// auto-reconnect, so that it can check the CONNACK's session-present flag:
// a lost session means a lost queue).
type persistentSubscriber struct {
	t      testing.TB
	client mqtt.Client
	filter string
	log    *eventLog

	lost chan struct{}
	stop chan struct{}
	done chan struct{}

	reconnects  atomic.Int64
	sessionLost atomic.Int64
}

func newPersistentSubscriber(t testing.TB, addr, clientID, filter string, log *eventLog) *persistentSubscriber {
	s := &persistentSubscriber{t: t, filter: filter, log: log, lost: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	o := mqtt.NewClientOptions()
	o.AddBroker("tcp://" + addr)
	o.SetClientID(clientID)
	o.SetProtocolVersion(4)
	o.SetCleanSession(false)
	o.SetAutoReconnect(false)
	o.SetConnectRetry(false)
	o.SetConnectTimeout(2 * time.Second)
	o.SetKeepAlive(5 * time.Second)
	o.SetOrderMatters(true) // handled one at a time, in arrival order
	// Messages queued by the session arrive right after CONNACK, before any
	// Subscribe call of ours: the default handler takes them.
	o.SetDefaultPublishHandler(func(_ mqtt.Client, msg mqtt.Message) { s.log.add(msg.Payload()) })
	o.SetConnectionLostHandler(func(mqtt.Client, error) {
		select {
		case s.lost <- struct{}{}:
		default:
		}
	})
	s.client = mqtt.NewClient(o)
	return s
}

// connect connects once and subscribes; it reports whether the broker still
// had the session.
func (s *persistentSubscriber) connect() (sessionPresent bool, err error) {
	tok := s.client.Connect()
	tok.Wait()
	if err := tok.Error(); err != nil {
		return false, err
	}
	present := tok.(*mqtt.ConnectToken).SessionPresent()
	if !present {
		st := s.client.Subscribe(s.filter, 1, nil)
		st.Wait()
		if err := st.Error(); err != nil {
			s.client.Disconnect(0)
			return false, err
		}
	}
	return present, nil
}

// run keeps the subscriber connected until close.
func (s *persistentSubscriber) run() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			return
		case <-s.lost:
		}
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			present, err := s.connect()
			if err == nil {
				s.reconnects.Add(1)
				if !present {
					s.sessionLost.Add(1)
					s.t.Errorf("subscriber reconnected without its session: the broker lost its queue")
				}
				break
			}
			select { // retry pacing while the broker is away
			case <-s.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

func (s *persistentSubscriber) close() {
	close(s.stop)
	<-s.done
	s.client.Disconnect(0)
}

// startPersistentSubscriber connects a persistent subscriber to addr (the
// broker itself, never through a proxy) and keeps it connected until the
// test ends.
func startPersistentSubscriber(t testing.TB, addr, clientID, filter string) *persistentSubscriber {
	t.Helper()
	s := newPersistentSubscriber(t, addr, clientID, filter, newEventLog())
	if _, err := s.connect(); err != nil {
		t.Fatalf("subscriber: %v", err)
	}
	go s.run()
	t.Cleanup(s.close)
	return s
}
