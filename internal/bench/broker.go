package bench

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// handler receives every message published under bench/ (a subscriber).
type handler func(topic string, payload []byte)

// broker is an MQTT broker on loopback with one subscriber to bench/#.
type broker interface {
	name() string
	url() string
	setHandler(h handler)
	// stop takes the broker away (connections drop, new ones are refused);
	// start brings it back on the same address.
	stop()
	start() error
	close()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// mochiBroker is the in-process broker, with an inline subscriber.
type mochiBroker struct {
	b *harness.Mochi
	h atomic.Pointer[handler]
}

func newMochi() (*mochiBroker, error) {
	m := &mochiBroker{}
	b, err := harness.LaunchMochi(harness.MochiOptions{})
	if err != nil {
		return nil, err
	}
	if err := b.Subscribe("bench/#", func(msg harness.Message) { m.deliver(msg.Topic, msg.Payload) }); err != nil {
		b.Close()
		return nil, err
	}
	m.b = b
	return m, nil
}

func (b *mochiBroker) name() string { return "mochi (in-process)" }
func (b *mochiBroker) url() string  { return b.b.URL() }

func (b *mochiBroker) setHandler(h handler) { b.h.Store(&h) }

func (b *mochiBroker) deliver(topic string, payload []byte) {
	if h := b.h.Load(); h != nil && *h != nil {
		(*h)(topic, payload)
	}
}

func (b *mochiBroker) start() error { return b.b.Resume() }
func (b *mochiBroker) stop()        { b.b.Stop() }
func (b *mochiBroker) close()       { b.b.Close() }

// mosquittoBinary finds mosquitto in PATH or /usr/sbin; "" if absent.
func mosquittoBinary(hint string) string {
	if hint != "" {
		if fi, err := os.Stat(hint); err == nil && fi.Mode().IsRegular() {
			return hint
		}
		return ""
	}
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

// mosquittoBroker is a Mosquitto of our own: its own config and port in a
// temporary directory, started and stopped by PID, with a paho subscriber.
type mosquittoBroker struct {
	bin, dir, conf, log string
	port                int
	addr                string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	sub    mqtt.Client
	h      atomic.Pointer[handler]
}

func newMosquitto(bin, dir string) (*mosquittoBroker, error) {
	m := &mosquittoBroker{bin: bin, dir: dir, conf: filepath.Join(dir, "mosquitto.conf"), log: filepath.Join(dir, "mosquitto.log")}
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if m.port, err = freePort(); err != nil {
			return nil, err
		}
		m.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port))
		var b strings.Builder
		fmt.Fprintf(&b, "listener %d 127.0.0.1\nallow_anonymous true\npersistence false\n", m.port)
		// No limits that would drop or throttle a QoS 1 subscriber.
		b.WriteString("max_queued_messages 0\nmax_inflight_messages 0\nset_tcp_nodelay true\nlog_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\n")
		if os.Geteuid() == 0 {
			b.WriteString("user root\n")
		}
		if err = os.WriteFile(m.conf, []byte(b.String()), 0o600); err != nil {
			return nil, err
		}
		if err = m.start(); err == nil {
			return m, nil
		}
	}
	return nil, fmt.Errorf("mosquitto did not start: %w", err)
}

func (m *mosquittoBroker) name() string { return "mosquitto " + mosquittoVersion(m.bin) }
func (m *mosquittoBroker) url() string  { return "tcp://" + m.addr }

func (m *mosquittoBroker) setHandler(h handler) { m.h.Store(&h) }

func (m *mosquittoBroker) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return errors.New("mosquitto already running")
	}
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(m.bin, "-c", m.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	m.cmd, m.exited = cmd, exited
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			m.cmd = nil
			b, _ := os.ReadFile(m.log)
			return fmt.Errorf("mosquitto exited at start-up: %s", strings.TrimSpace(string(b)))
		default:
		}
		if c, err := net.DialTimeout("tcp", m.addr, 100*time.Millisecond); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			m.stopLocked()
			return fmt.Errorf("mosquitto did not accept connections on %s", m.addr)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The subscriber: QoS 1, a clean session, handler calls in order.
	o := mqtt.NewClientOptions().AddBroker(m.url()).SetClientID("bench-sub-" + strconv.Itoa(os.Getpid())).
		SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(true)
	sub := mqtt.NewClient(o)
	if tok := sub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		m.stopLocked()
		return fmt.Errorf("subscriber connect: %v", tok.Error())
	}
	tok := sub.Subscribe("bench/#", 1, func(_ mqtt.Client, msg mqtt.Message) {
		if h := m.h.Load(); h != nil && *h != nil {
			(*h)(msg.Topic(), msg.Payload())
		}
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		sub.Disconnect(0)
		m.stopLocked()
		return fmt.Errorf("subscribe: %v", tok.Error())
	}
	m.sub = sub
	return nil
}

func (m *mosquittoBroker) stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopLocked()
}

func (m *mosquittoBroker) stopLocked() {
	if m.sub != nil {
		m.sub.Disconnect(0)
		m.sub = nil
	}
	if m.cmd == nil {
		return
	}
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

func (m *mosquittoBroker) close() { m.stop() }

func mosquittoVersion(bin string) string {
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "mosquitto" && f[1] == "version" {
			return f[2]
		}
	}
	return ""
}
