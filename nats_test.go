package outbox

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// natsServer is a NATS server with JetStream and its MQTT listener, owned
// by a test: its own config and store in t.TempDir(), loopback ports of its
// own, stopped by PID. mqttConf lines go into the mqtt block (a tls block
// makes the MQTT listener TLS-only: NATS has one MQTT listener).
type natsServer struct {
	mqttAddr string
}

func startNATS(t *testing.T, mqttConf ...string) *natsServer {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		for _, p := range []string{"/usr/sbin/nats-server", "/usr/bin/nats-server"} {
			if _, err := os.Stat(p); err == nil {
				bin = p
			}
		}
	}
	if bin == "" {
		t.Skip("nats-server is not installed: apt-get install -y nats-server")
	}
	dir := t.TempDir()
	clientPort, err := harness.FreePort()
	require.NoError(t, err)
	mqttPort, err := harness.FreePort()
	require.NoError(t, err)
	conf := filepath.Join(dir, "nats.conf")
	// MQTT in NATS needs a server name and JetStream (sessions and QoS 1
	// messages live in streams).
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf(`server_name: outbox_test
listen: 127.0.0.1:%d
jetstream { store_dir: %q }
mqtt {
  listen: 127.0.0.1:%d
  %s
}
`, clientPort, filepath.Join(dir, "js"), mqttPort, strings.Join(mqttConf, "\n  "))), 0o600))
	n := &natsServer{mqttAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(mqttPort))}
	runServer(t, "nats-server", filepath.Join(dir, "nats.log"), "Listening for MQTT clients", n.mqttAddr, bin, "-c", conf)
	return n
}

// TestNATSCompatibility runs the relay's core cases against NATS Server's
// MQTT listener (JetStream): publish in order, an outage in the middle of a
// backlog, and a PUBACK withheld until the connection drops.
func TestNATSCompatibility(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	n := startNATS(t)
	sub := startPersistentSubscriber(t, n.mqttAddr, "nats-consumer", "pos/#")
	p := harness.StartFaultProxy(t, n.mqttAddr)
	ob := openTest(t, Options{})
	r := mqttRelay(t, ob, p.URL(), fastRelay())
	startRelay(t, r)

	dups := brokerCases(t, ob, r, p, sub)
	t.Logf("NATS: 401 events delivered in order, %d duplicates, 0 dead", dups)
}

// TestNATSRefusesSomeTopics: NATS maps MQTT topics to subjects and refuses
// a publish to a topic with '.' or ' ' by closing the connection — the way
// an MQTT 3.1.1 broker refuses. The isolation rule parks such a message as
// dead after MaxAttempts, and the rest flows.
func TestNATSRefusesSomeTopics(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	n := startNATS(t)
	sub := startPersistentSubscriber(t, n.mqttAddr, "nats-consumer", "pos/#")
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.MaxAttempts = 2
	startRelay(t, mqttRelay(t, ob, "tcp://"+n.mqttAddr, opts))
	commitOrder(t, ob, "pos/a.b", 1)
	commitOrder(t, ob, "pos/a b", 2)
	commitOrder(t, ob, "pos/ok", 3)
	eventually(t, 20*time.Second, "two dead, one sent", func() bool {
		return countState(t, ob, "dead") == 2 && countState(t, ob, "sent") == 1
	})
	eventually(t, 5*time.Second, "the valid one delivered", func() bool { return sub.Log.Unique() == 1 })
	for _, seq := range []int64{1, 2} {
		state, attempts := rowState(t, ob, seq)
		require.Equal(t, "dead", state)
		require.Equal(t, 2, attempts)
	}
}
