package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// RabbitMQ (the Debian package, 3.10) with its MQTT plugin. The node is
// owned by the test: config, data, logs, enabled-plugins file and a HOME
// with its own Erlang cookie live in the test's directory; it has its own
// node name and loopback ports of its own for AMQP, MQTT, Erlang
// distribution and epmd. Nothing outlives the test: the harness starts
// epmd itself as a child (so the node does not spawn a daemon one), the
// node is run as a single process (the Erlang VM, not the shell wrapper
// that forks it), and both are stopped by PID.

// a cold start is ~10 s here; 4-6 s of it is a fixed MQTT Raft wait
const rabbitStartWait = 90 * time.Second

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

// RabbitMQ is one RabbitMQ node owned by a test.
type RabbitMQ struct {
	MQTTAddr    string // the plain MQTT listener
	MQTTTLSAddr string // the TLS listener, with RabbitMQOptions.TLS only
	Node        string
	Version     string
	Started     time.Duration // from exec to accepting MQTT connections
}

// RabbitMQOptions shape a node.
type RabbitMQOptions struct {
	// TLS, if set, adds an MQTT TLS listener on a loopback port of its
	// own, with these files; it requires a client certificate from the CA.
	TLS *ServerTLS
	// Config lines are appended to rabbitmq.conf.
	Config []string
}

// StartRabbitMQ starts a RabbitMQ node with the MQTT plugin listening on
// 127.0.0.1 that lives as long as tb, skipping tb if RabbitMQ is not
// installed. MQTT clients log in anonymously as guest, which RabbitMQ
// allows from loopback only.
func StartRabbitMQ(tb TB, o RabbitMQOptions) *RabbitMQ {
	tb.Helper()
	bin := rabbitMQServer()
	if bin == "" {
		tb.Skipf("rabbitmq-server is not installed: apt-get install -y rabbitmq-server")
	}
	epmd := needEpmd(tb, "rabbitmq-server")
	dir := tb.TempDir()
	ports := freePorts(tb, 5)
	amqpPort, mqttPort, distPort, epmdPort := ports[0], ports[1], ports[2], ports[3]
	r := &RabbitMQ{
		MQTTAddr: loopback(mqttPort),
		Node:     fmt.Sprintf("outbox-test-%d@localhost", mqttPort),
	}
	extra := o.Config
	if o.TLS != nil {
		r.MQTTTLSAddr = loopback(ports[4])
		// ssl_options are the node's TLS settings; with no AMQP TLS
		// listener, only MQTT's uses them.
		extra = append([]string{
			"mqtt.listeners.ssl.default = " + r.MQTTTLSAddr,
			"ssl_options.cacertfile = " + o.TLS.CAFile,
			"ssl_options.certfile = " + o.TLS.CertFile,
			"ssl_options.keyfile = " + o.TLS.KeyFile,
			"ssl_options.verify = verify_peer",
			"ssl_options.fail_if_no_peer_cert = true",
		}, extra...)
	}

	for _, d := range []string{filepath.Join(dir, "mnesia"), filepath.Join(dir, "log")} {
		must(tb, os.Mkdir(d, 0o700), "rabbitmq directories")
	}
	plugins := filepath.Join(dir, "enabled_plugins")
	must(tb, os.WriteFile(plugins, []byte("[rabbitmq_mqtt].\n"), 0o600), "enabled_plugins")
	conf := filepath.Join(dir, "rabbitmq.conf")
	must(tb, os.WriteFile(conf, []byte(fmt.Sprintf(`mqtt.listeners.tcp.1 = 127.0.0.1:%d
mqtt.allow_anonymous = true
mqtt.default_user = guest
mqtt.default_pass = guest
%s
`, mqttPort, strings.Join(extra, "\n"))), 0o600), "rabbitmq.conf")

	env := append(erlangEnv(tb, dir, epmd, epmdPort, "RABBITMQ_"),
		"RABBITMQ_NODENAME="+r.Node,
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

	start := time.Now()
	p := startProcess(tb, "rabbitmq", filepath.Join(dir, "rabbitmq.log"), dir, env, erlangStopWait, bin, "-noinput")
	version := regexp.MustCompile(`Starting RabbitMQ (\S+)`)
	p.waitReady(tb, rabbitStartWait, func(log []byte) bool {
		if !strings.Contains(string(log), "Server startup complete") ||
			!listening(r.MQTTAddr) || (r.MQTTTLSAddr != "" && !listening(r.MQTTTLSAddr)) {
			return false
		}
		if m := version.FindSubmatch(log); m != nil {
			r.Version = string(m[1])
		}
		return true
	})
	r.Started = time.Since(start)
	tb.Logf("RabbitMQ %s (node %s) accepting MQTT on %s after %s", r.Version, r.Node, r.MQTTAddr, r.Started.Round(time.Millisecond))
	return r
}
