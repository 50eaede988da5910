//go:build linux

package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// This file runs RabbitMQ (the Debian package, 3.10) with its MQTT plugin.
// The node is owned by the test: config, data, logs, enabled-plugins file
// and a HOME with its own Erlang cookie live in t.TempDir(); it has its own
// node name and loopback ports of its own for AMQP, MQTT, Erlang
// distribution and epmd. Nothing outlives the test: the test starts epmd
// itself as a child (so the node does not spawn a daemon one), the node is
// run as a single process (the Erlang VM, not the shell wrapper that forks
// it), and both are stopped by PID.

const (
	rabbitStartWait = 90 * time.Second // a cold start is ~10 s here; 4-6 s of it is a fixed MQTT Raft wait
	rabbitStopWait  = 20 * time.Second
)

// rabbitMQServer finds the rabbitmq-server start script, or "". Debian's
// /usr/sbin/rabbitmq-server is a wrapper that switches to the rabbitmq
// user and /var/lib/rabbitmq; the real script is under /usr/lib/rabbitmq.
func rabbitMQServer() string {
	for _, p := range []string{"/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/local/lib/rabbitmq/bin/rabbitmq-server"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	if p, err := exec.LookPath("rabbitmq-server"); err == nil && p != "/usr/sbin/rabbitmq-server" {
		return p // a generic-unix or Homebrew install: the script itself
	}
	return ""
}

func rabbitEpmdBinary() string {
	if p, err := exec.LookPath("epmd"); err == nil {
		return p
	}
	if p := "/usr/lib/erlang/bin/epmd"; rabbitExecutable(p) {
		return p
	}
	return ""
}

func rabbitExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// rabbitMQ is one RabbitMQ node owned by a test.
type rabbitMQ struct {
	mqttAddr    string
	mqttTLSAddr string // with a rabbitTLS listener only
	node        string
	version     string
	started     time.Duration // from exec to accepting MQTT connections
}

// rabbitFreePorts returns n distinct free loopback ports.
func rabbitFreePorts(t *testing.T, n int) []int {
	t.Helper()
	seen := map[int]bool{}
	var ports []int
	for len(ports) < n {
		p, err := harness.FreePort()
		require.NoError(t, err)
		if !seen[p] {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	return ports
}

// rabbitTLS is an MQTT TLS listener's files (PEM): the node's certificate
// and key, and the CA it takes client certificates from. A client
// certificate is required.
type rabbitTLS struct {
	caFile, certFile, keyFile string
}

// startRabbitMQ starts a RabbitMQ node with the MQTT plugin listening on
// 127.0.0.1, and stops it when the test ends. extraConf lines are appended
// to rabbitmq.conf. MQTT clients log in anonymously as guest, which
// RabbitMQ allows from loopback only.
func startRabbitMQ(t *testing.T, extraConf ...string) *rabbitMQ {
	t.Helper()
	return startRabbitMQWith(t, nil, extraConf...)
}

// startRabbitMQWith is startRabbitMQ with, if tlsL is set, an MQTT TLS
// listener on a loopback port of its own as well (mqttTLSAddr).
func startRabbitMQWith(t *testing.T, tlsL *rabbitTLS, extraConf ...string) *rabbitMQ {
	t.Helper()
	bin := rabbitMQServer()
	if bin == "" {
		t.Skip("rabbitmq-server is not installed: apt-get install -y rabbitmq-server")
	}
	epmd := rabbitEpmdBinary()
	if epmd == "" {
		t.Skip("epmd (Erlang) is not installed: apt-get install -y rabbitmq-server")
	}
	dir := t.TempDir()
	ports := rabbitFreePorts(t, 5)
	amqpPort, mqttPort, distPort, epmdPort := ports[0], ports[1], ports[2], ports[3]
	r := &rabbitMQ{
		mqttAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(mqttPort)),
		node:     fmt.Sprintf("outbox-test-%d@localhost", mqttPort),
	}
	if tlsL != nil {
		r.mqttTLSAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[4]))
		// ssl_options are the node's TLS settings; with no AMQP TLS
		// listener, only MQTT's uses them.
		extraConf = append([]string{
			"mqtt.listeners.ssl.default = " + r.mqttTLSAddr,
			"ssl_options.cacertfile = " + tlsL.caFile,
			"ssl_options.certfile = " + tlsL.certFile,
			"ssl_options.keyfile = " + tlsL.keyFile,
			"ssl_options.verify = verify_peer",
			"ssl_options.fail_if_no_peer_cert = true",
		}, extraConf...)
	}

	for _, d := range []string{filepath.Join(dir, "mnesia"), filepath.Join(dir, "log")} {
		require.NoError(t, os.Mkdir(d, 0o700))
	}
	plugins := filepath.Join(dir, "enabled_plugins")
	require.NoError(t, os.WriteFile(plugins, []byte("[rabbitmq_mqtt].\n"), 0o600))
	conf := filepath.Join(dir, "rabbitmq.conf")
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf(`mqtt.listeners.tcp.1 = 127.0.0.1:%d
mqtt.allow_anonymous = true
mqtt.default_user = guest
mqtt.default_pass = guest
%s
`, mqttPort, strings.Join(extraConf, "\n"))), 0o600))

	env := append(erlangEnv(t, dir, epmd, epmdPort, "RABBITMQ_"),
		"RABBITMQ_NODENAME="+r.node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(amqpPort),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
		// The distribution listener binds every interface unless told.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"RABBITMQ_CONFIG_FILE="+conf,
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"), // absent
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"),      // absent: not /etc/rabbitmq's
		"RABBITMQ_ENABLED_PLUGINS_FILE="+plugins,
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_LOGS=-", // the node's log on stdout, into rabbitmq.log
		// Without it the script forks the VM and waits in a shell: SIGKILL
		// or Pdeathsig would reach the shell and orphan the node. With it
		// the script execs the VM, so our child is the node (we pass
		// -noinput ourselves, since this mode leaves the shell's stdin on).
		"RABBITMQ_ALLOW_INPUT=1",
	)

	logFile := filepath.Join(dir, "rabbitmq.log")
	start := time.Now()
	exited := startRabbitChild(t, "rabbitmq", logFile, dir, env, bin, "-noinput")
	deadline := start.Add(rabbitStartWait)
	for {
		select {
		case <-exited:
			t.Fatalf("rabbitmq-server exited during start-up:\n%s", rabbitLogTail(logFile, 80))
		default:
		}
		b, _ := os.ReadFile(logFile)
		if strings.Contains(string(b), "Server startup complete") {
			if rabbitListening(r.mqttAddr) && (r.mqttTLSAddr == "" || rabbitListening(r.mqttTLSAddr)) {
				if m := regexp.MustCompile(`Starting RabbitMQ (\S+)`).FindSubmatch(b); m != nil {
					r.version = string(m[1])
				}
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("rabbitmq-server not accepting MQTT connections after %s:\n%s", rabbitStartWait, rabbitLogTail(logFile, 80))
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.started = time.Since(start)
	t.Logf("RabbitMQ %s (node %s) accepting MQTT on %s after %s", r.version, r.node, r.mqttAddr, r.started.Round(time.Millisecond))
	return r
}

// erlangEnv prepares what every Erlang node a test starts needs, in dir: a
// HOME with a cookie only its owner can read, and an epmd of its own on
// epmdPort, started as the test's child so that the node does not spawn
// "epmd -daemon", which would outlive the test. It returns the node's
// environment: the caller's, without its Erlang settings, its HOME, its
// systemd socket and any variable with one of the drop prefixes (they
// could point the node at a system-wide epmd, cookie or config).
func erlangEnv(t *testing.T, dir, epmd string, epmdPort int, drop ...string) []string {
	t.Helper()
	home := filepath.Join(dir, "home")
	require.NoError(t, os.Mkdir(home, 0o700))
	cookie := make([]byte, 16)
	_, err := rand.Read(cookie)
	require.NoError(t, err)
	// Erlang refuses a cookie file that others can read.
	require.NoError(t, os.WriteFile(filepath.Join(home, ".erlang.cookie"), []byte(strings.ToUpper(hex.EncodeToString(cookie))), 0o400))

	drop = append(drop, "ERL_", "HOME=", "NOTIFY_SOCKET=")
	var env []string
	for _, kv := range os.Environ() {
		if !slices.ContainsFunc(drop, func(p string) bool { return strings.HasPrefix(kv, p) }) {
			env = append(env, kv)
		}
	}
	env = append(env,
		"HOME="+home,
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_EPMD_PORT="+strconv.Itoa(epmdPort),
		"ERL_CRASH_DUMP="+filepath.Join(dir, "erl_crash.dump"),
	)
	startRabbitChild(t, "epmd", filepath.Join(dir, "epmd.log"), dir, env, epmd, "-port", strconv.Itoa(epmdPort), "-address", "127.0.0.1")
	epmdAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(epmdPort))
	eventually(t, 10*time.Second, "epmd listening", func() bool { return rabbitListening(epmdAddr) })
	return env
}

func rabbitListening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// startRabbitChild starts one process owned by the test, output to logFile, and
// stops it by PID when the test ends: SIGTERM, then SIGKILL. Cleanups run
// last-in first-out, so a child started later is stopped first. The
// returned channel is closed once the process has exited.
func startRabbitChild(t *testing.T, name, logFile, dir string, env []string, argv ...string) <-chan struct{} {
	t.Helper()
	logf, err := os.Create(logFile)
	require.NoError(t, err)
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies without cleaning up, so does the child.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start(), "start %s", name)
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(rabbitStopWait):
			t.Logf("%s did not stop within %s of SIGTERM: SIGKILL", name, rabbitStopWait)
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s log (%s), last lines:\n%s", name, logFile, rabbitLogTail(logFile, 150))
		}
	})
	return exited
}

func rabbitLogTail(file string, n int) string {
	b, _ := os.ReadFile(file)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestRabbitMQCompatibility runs the relay's core cases against RabbitMQ's
// MQTT plugin: publish in order, an outage in the middle of a backlog, and
// a PUBACK withheld until the connection drops.
//
// RabbitMQ 3.10 maps MQTT topics to AMQP routing keys on amq.topic by
// turning '/' into '.', and back again on delivery: a '.' in a topic is a
// level separator there, so "pos/a.b" reaches subscribers as "pos/a/b"
// (and matches "pos/+/+", not "pos/+"). The relay is unaffected; consumers
// see a different topic. Topics here have no '.'.
func TestRabbitMQCompatibility(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	rmq := startRabbitMQ(t)
	sub := startPersistentSubscriber(t, rmq.mqttAddr, "rabbitmq-consumer", "pos/#")
	p := harness.StartFaultProxy(t, rmq.mqttAddr)
	ob := openTest(t, Options{})
	r := mqttRelay(t, ob, p.URL(), fastRelay())
	startRelay(t, r)

	dups := brokerCases(t, ob, r, p, sub)
	t.Logf("RabbitMQ %s: 401 events delivered in order, %d duplicates, 0 dead (broker start %s)",
		rmq.version, dups, rmq.started.Round(100*time.Millisecond))
}

// TestRabbitMQOversizeNeverAcknowledged: RabbitMQ 3.10 refuses a publish
// over max_message_size (default 128 MiB; lowered to 1 MiB here) without
// closing the MQTT connection. The plugin publishes through an internal
// AMQP channel; the refusal kills that channel ("precondition_failed:
// message size ... is larger than configured max size") and the connection
// goes on answering PINGREQs but never sends another PUBACK — not for the
// refused message, not for those after it, not even for one before it that
// was already routed to subscribers. (A publish refused by topic
// permissions, by contrast, closes the connection, as other brokers do.)
// So the relay cannot see a refusal, only a missing PUBACK: it takes
// AckTimeout per attempt, and the isolation rule still finds the message,
// sends it alone, charges it and parks it as dead after MaxAttempts, while
// the rest is delivered in order.
func TestRabbitMQOversizeNeverAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const brokerMax = 1 << 20
	rmq := startRabbitMQ(t, fmt.Sprintf("max_message_size = %d", brokerMax))
	sub := startPersistentSubscriber(t, rmq.mqttAddr, "rabbitmq-consumer", "pos/#")
	big := fmt.Appendf(nil, `{"n":2,"pad":%q}`, strings.Repeat("x", brokerMax+brokerMax/2))

	// What the broker does, seen by a plain client: no PUBACK for the
	// refused publish.
	o := mqtt.NewClientOptions().AddBroker("tcp://" + rmq.mqttAddr).SetClientID("rabbitmq-probe").
		SetProtocolVersion(4).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
	c := mqtt.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second), "probe connect")
	require.NoError(t, tok.Error())
	pub := c.Publish("probe/big", 1, false, big)
	acked := pub.WaitTimeout(3*time.Second) && pub.Error() == nil
	require.False(t, acked, "a publish over max_message_size acknowledged")
	t.Logf("RabbitMQ %s, oversize publish: no PUBACK after 3 s; connection still open: %v", rmq.version, c.IsConnectionOpen())
	c.Disconnect(0)

	ob := openTest(t, Options{MaxPayloadBytes: 4 << 20})
	opts := fastRelay()
	opts.MaxAttempts = 2
	startRelay(t, mqttRelay(t, ob, "tcp://"+rmq.mqttAddr, opts))
	start := time.Now()
	commitOrder(t, ob, "pos/orders", 1)
	require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
		return ob.Enqueue(context.Background(), tx, Message{Topic: "pos/orders", Payload: big})
	}))
	commitOrder(t, ob, "pos/orders", 3)
	eventually(t, 60*time.Second, "the oversize one dead, the others sent", func() bool {
		return countState(t, ob, "dead") == 1 && countState(t, ob, "sent") == 2
	})
	eventually(t, 5*time.Second, "the others delivered", func() bool { return sub.Log.Unique() == 2 })
	state, attempts := rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	require.Equal(t, 2, attempts)
	var lastErr string
	require.NoError(t, ob.DB().QueryRow(`SELECT coalesce(last_error, '') FROM outbox WHERE seq = 2`).Scan(&lastErr))
	require.Contains(t, lastErr, "acknowledgement", "charged for a missing PUBACK")

	got := sub.Log.Snapshot()
	require.Empty(t, got.Disorder, "first deliveries in commit order")
	require.Zero(t, got.DecodeErrors)
	t.Logf("RabbitMQ %s: oversize message dead after %d attempts in %s (AckTimeout %s each), others delivered in order, %d duplicates",
		rmq.version, attempts, time.Since(start).Round(100*time.Millisecond), opts.AckTimeout, got.Duplicates)
}
