package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// NATS is a NATS server with JetStream and its MQTT listener, owned by a
// test: its own configuration and store in the test's directory, loopback
// ports of its own, stopped by PID.
type NATS struct {
	Addr     string // host:port of the client listener (NATS and JetStream)
	MQTTAddr string // host:port of the MQTT listener
}

func natsBinary() string {
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/nats-server", "/usr/bin/nats-server"} {
		if executable(p) {
			return p
		}
	}
	return ""
}

// StartNATS starts a NATS server that lives as long as tb, skipping tb if
// nats-server is not installed. mqttConf lines go into the mqtt block: a
// tls block there makes the MQTT listener TLS-only, as NATS has one MQTT
// listener.
func StartNATS(tb TB, mqttConf ...string) *NATS {
	tb.Helper()
	return StartNATSWith(tb, nil, mqttConf...)
}

// StartNATSWith is StartNATS with conf's lines at the configuration's top
// level too (an authorization block, say).
func StartNATSWith(tb TB, conf []string, mqttConf ...string) *NATS {
	tb.Helper()
	bin := natsBinary()
	if bin == "" {
		tb.Skipf("nats-server is not installed: apt-get install -y nats-server")
	}
	dir := tb.TempDir()
	ports := freePorts(tb, 2)
	file := filepath.Join(dir, "nats.conf")
	// MQTT in NATS needs a server name and JetStream (sessions and QoS 1
	// messages live in streams).
	must(tb, os.WriteFile(file, []byte(fmt.Sprintf(`server_name: outbox_test
listen: 127.0.0.1:%d
jetstream { store_dir: %q }
%s
mqtt {
  listen: 127.0.0.1:%d
  %s
}
`, ports[0], filepath.Join(dir, "js"), strings.Join(conf, "\n"), ports[1], strings.Join(mqttConf, "\n  "))), 0o600), "nats.conf")
	n := &NATS{Addr: loopback(ports[0]), MQTTAddr: loopback(ports[1])}
	p := startProcess(tb, "nats-server", filepath.Join(dir, "nats.log"), "", nil, 10*time.Second, bin, "-c", file)
	p.waitReady(tb, 15*time.Second, func(log []byte) bool {
		return strings.Contains(string(log), "Listening for MQTT clients") && listening(n.MQTTAddr) && listening(n.Addr)
	})
	return n
}

// NATSCluster is a cluster of NATS servers with JetStream clustered and an
// MQTT listener on each node, owned by a test: each node with its own
// configuration, store and loopback ports, routes to every other node.
type NATSCluster struct {
	Nodes []*NATSNode
}

// NATSNode is one node of a NATSCluster.
type NATSNode struct {
	Name     string
	Addr     string // host:port of the NATS client listener
	MQTTAddr string
	proc     *process
}

// StartNATSCluster starts n nodes (3 for a JetStream quorum that survives
// one node), skipping tb if nats-server is not installed, and waits until
// JetStream has a metadata leader and every MQTT listener is up.
func StartNATSCluster(tb TB, n int) *NATSCluster {
	tb.Helper()
	bin := natsBinary()
	if bin == "" {
		tb.Skipf("nats-server is not installed: apt-get install -y nats-server")
	}
	ports := freePorts(tb, 3*n) // client, cluster, mqtt per node
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3*i+1]))
	}
	c := &NATSCluster{}
	var logs []string
	for i := range n {
		dir := tb.TempDir()
		name := fmt.Sprintf("node-%d", i+1)
		conf := filepath.Join(dir, "nats.conf")
		must(tb, os.WriteFile(conf, []byte(fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
jetstream { store_dir: %q }
cluster {
  name: outbox_test
  listen: 127.0.0.1:%d
  routes: [%s]
}
mqtt {
  listen: 127.0.0.1:%d
  # A QoS 1 message a node handed to a subscriber's connection and that
  # was never acknowledged (the node hung) is delivered again after this,
  # on whichever node the session has moved to; NATS's default is 30 s.
  ack_wait: "3s"
}
`, name, ports[3*i], filepath.Join(dir, "js"), ports[3*i+1], strings.Join(routes, ", "), ports[3*i+2])), 0o600), "nats.conf")
		logFile := filepath.Join(dir, "nats.log")
		logs = append(logs, logFile)
		p := startProcess(tb, "nats-server "+name, logFile, "", nil, 10*time.Second, bin, "-c", conf)
		c.Nodes = append(c.Nodes, &NATSNode{Name: name, Addr: loopback(ports[3*i]), MQTTAddr: loopback(ports[3*i+2]), proc: p})
	}
	for _, node := range c.Nodes {
		node.proc.waitReady(tb, 30*time.Second, func(log []byte) bool {
			return strings.Contains(string(log), "Listening for MQTT clients") && listening(node.MQTTAddr)
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		leader := false
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			leader = leader || strings.Contains(string(b), "JetStream cluster new metadata leader") || strings.Contains(string(b), "Self is new JetStream cluster metadata leader")
		}
		if leader {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("NATS cluster: no JetStream metadata leader after 30 s:\n%s", tail(logs[0], 40))
		}
		time.Sleep(50 * time.Millisecond) // polling the logs, bounded by the deadline
	}
	return c
}

// Kill ends the node at once (SIGKILL), as a crashed machine would.
func (n *NATSNode) Kill() {
	_ = n.proc.cmd.Process.Kill()
	<-n.proc.exited
}

// Pause stops the node (SIGSTOP): its sockets stay open and say nothing,
// as a hung machine's would. Resume lets it go on.
func (n *NATSNode) Pause()  { _ = n.proc.cmd.Process.Signal(syscall.SIGSTOP) }
func (n *NATSNode) Resume() { _ = n.proc.cmd.Process.Signal(syscall.SIGCONT) }
