package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// NATS is a NATS server with JetStream and its MQTT listener, owned by a
// test: its own configuration and store in the test's directory, loopback
// ports of its own, stopped by PID.
type NATS struct {
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
	bin := natsBinary()
	if bin == "" {
		tb.Skipf("nats-server is not installed: apt-get install -y nats-server")
	}
	dir := tb.TempDir()
	ports := freePorts(tb, 2)
	conf := filepath.Join(dir, "nats.conf")
	// MQTT in NATS needs a server name and JetStream (sessions and QoS 1
	// messages live in streams).
	must(tb, os.WriteFile(conf, []byte(fmt.Sprintf(`server_name: outbox_test
listen: 127.0.0.1:%d
jetstream { store_dir: %q }
mqtt {
  listen: 127.0.0.1:%d
  %s
}
`, ports[0], filepath.Join(dir, "js"), ports[1], strings.Join(mqttConf, "\n  "))), 0o600), "nats.conf")
	n := &NATS{MQTTAddr: loopback(ports[1])}
	p := startProcess(tb, "nats-server", filepath.Join(dir, "nats.log"), "", nil, 10*time.Second, bin, "-c", conf)
	p.waitReady(tb, 15*time.Second, func(log []byte) bool {
		return strings.Contains(string(log), "Listening for MQTT clients") && listening(n.MQTTAddr)
	})
	return n
}
