//go:build linux

package outbox

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// This file runs ejabberd (the Debian package, 23.01) for its MQTT broker,
// mod_mqtt. The node is owned by the test: ejabberd.yml, the Mnesia spool,
// logs and a HOME with its own Erlang cookie live in t.TempDir(); it has
// its own node name and loopback ports of its own for MQTT, Erlang
// distribution and epmd. Nothing outlives the test: the test starts epmd
// itself as a child, and runs the Erlang VM directly rather than through
// /usr/sbin/ejabberdctl, which as root switches to the ejabberd user (who
// cannot enter the test's directories) and keeps the VM as a grandchild
// behind a shell. /usr/bin/erl execs the VM, so our child is the node, and
// both are stopped by PID (startRabbitChild, rabbitmq_test.go).
//
// Logging in: ejabberd maps an MQTT client to a JID, user@host/client-id
// (the user is the CONNECT user name, or the client id when there is none),
// and checks the password with the host's auth_method. An empty password is
// never checked against it: it means certificate authentication (a TLS
// listener with tls_verify, the client certificate's CN naming the user),
// and without one the CONNECT is refused with CONNACK 5. So the plain
// listener's clients here log in with a user name and a password, which
// anonymous login (auth_method anonymous, anonymous_protocol login_anon)
// accepts, whatever they are.

const (
	ejabberdStartWait = 90 * time.Second // a cold start is ~1 s here
	// ejabberdPassword is any non-empty password: anonymous login takes any.
	ejabberdPassword = "outbox-test"
)

// ejabberdInstall finds the Erlang runtime and ejabberd's code: erl, and
// the directory holding ejabberd-<version>/ebin (ERL_LIBS). Debian puts it
// in /usr/lib/<triplet>.
func ejabberdInstall() (erl, libs string) {
	erl, err := exec.LookPath("erl")
	if err != nil {
		if !rabbitExecutable("/usr/lib/erlang/bin/erl") {
			return "", ""
		}
		erl = "/usr/lib/erlang/bin/erl"
	}
	for _, pattern := range []string{"/usr/lib/*/ejabberd-*/ebin/ejabberd.app", "/usr/lib/ejabberd-*/ebin/ejabberd.app", "/usr/lib/erlang/lib/ejabberd-*/ebin/ejabberd.app"} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return erl, filepath.Dir(filepath.Dir(filepath.Dir(m[0])))
		}
	}
	return "", ""
}

// ejabberd is one ejabberd node owned by a test.
type ejabberd struct {
	mqttAddr    string // the plain listener; "" with TLS
	mqttTLSAddr string // the TLS listener, with ejabberdOptions.tls only
	node        string
	version     string
	started     time.Duration // from exec to accepting MQTT connections
	logFile     string        // the node's console output: its log
}

// ejabberdOptions shape a node. With tls, the node has a TLS listener only
// (tls_verify: a client certificate from caFile logs in as the user its CN
// names) and no password logins at all (auth_method internal, no users),
// so a client certificate is required. Without it, a plain listener and
// anonymous login. Either way clients publish and subscribe under pos/ and
// nowhere else.
type ejabberdOptions struct {
	tls *rabbitTLS
}

func startEjabberd(t *testing.T) *ejabberd {
	t.Helper()
	return startEjabberdWith(t, ejabberdOptions{})
}

func startEjabberdWith(t *testing.T, o ejabberdOptions) *ejabberd {
	t.Helper()
	if testing.Short() {
		t.Skip("-short")
	}
	erl, libs := ejabberdInstall()
	if erl == "" {
		t.Skip("ejabberd is not installed: apt-get install -y ejabberd")
	}
	epmd := rabbitEpmdBinary()
	if epmd == "" {
		t.Skip("epmd (Erlang) is not installed: apt-get install -y ejabberd")
	}
	dir := t.TempDir()
	ports := rabbitFreePorts(t, 3)
	mqttPort, distPort, epmdPort := ports[0], ports[1], ports[2]
	e := &ejabberd{node: fmt.Sprintf("outbox-ejabberd-%d@localhost", mqttPort)}
	listenAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mqttPort))

	spool, logs := filepath.Join(dir, "spool"), filepath.Join(dir, "log")
	for _, d := range []string{spool, logs} {
		require.NoError(t, os.Mkdir(d, 0o700))
	}
	// Name resolution for the node's host part: localhost, nothing else
	// (Debian's /etc/ejabberd/inetrc, kept here so that /etc is not needed).
	inetrc := filepath.Join(dir, "inetrc")
	require.NoError(t, os.WriteFile(inetrc, []byte("{lookup,[\"file\",\"native\"]}.\n{host,{127,0,0,1},[\"localhost\"]}.\n"), 0o600))

	var conf strings.Builder
	conf.WriteString("hosts:\n  - localhost\nloglevel: info\nlog_rotate_count: 0\nhide_sensitive_log_data: false\n")
	// Nothing of the node's reaches out: no ACME certificate requests.
	conf.WriteString("acme:\n  auto: false\n")
	listener := fmt.Sprintf("listen:\n  - port: %d\n    ip: \"127.0.0.1\"\n    module: mod_mqtt\n", mqttPort)
	if o.tls != nil {
		e.mqttTLSAddr = listenAddr
		// ca_file is what the node checks its own certificate against;
		// c2s_cafile, client certificates.
		fmt.Fprintf(&conf, "auth_method: [internal]\ncertfiles:\n  - %q\n  - %q\nca_file: %q\nc2s_cafile: %q\n", o.tls.certFile, o.tls.keyFile, o.tls.caFile, o.tls.caFile)
		listener += "    tls: true\n    tls_verify: true\n"
	} else {
		e.mqttAddr = listenAddr
		conf.WriteString("auth_method: [anonymous]\nanonymous_protocol: login_anon\nallow_multiple_connections: true\n")
	}
	conf.WriteString(listener)
	conf.WriteString("modules:\n  mod_mqtt:\n")
	// access_publish and access_subscribe are allow-lists: once a topic
	// filter is listed, a topic none of them matches is refused.
	conf.WriteString("    access_publish:\n      \"pos/#\": all\n    access_subscribe:\n      \"pos/#\": all\n")
	confFile := filepath.Join(dir, "ejabberd.yml")
	require.NoError(t, os.WriteFile(confFile, []byte(conf.String()), 0o600))

	env := append(erlangEnv(t, dir, epmd, epmdPort, "EJABBERD", "CONTRIB_MODULES"),
		"ERL_INETRC="+inetrc,
		"ERL_LIBS="+libs,
		"EJABBERD_CONFIG_PATH="+confFile,
		"EJABBERD_LOG_PATH="+filepath.Join(logs, "ejabberd.log"),
		"CONTRIB_MODULES_PATH="+filepath.Join(dir, "contrib"),
		"CONTRIB_MODULES_CONF_DIR="+filepath.Join(dir, "contrib-conf"),
	)

	// What ejabberdctl foreground runs, minus the user switch and the
	// shell: the node logs to stdout as well as to its log file.
	logFile := filepath.Join(dir, "ejabberd.console")
	start := time.Now()
	exited := startRabbitChild(t, "ejabberd", logFile, dir, env, erl,
		"-sname", e.node, "-start_epmd", "false",
		"-kernel", "inet_dist_use_interface", "{127,0,0,1}",
		"-kernel", "inet_dist_listen_min", strconv.Itoa(distPort),
		"-kernel", "inet_dist_listen_max", strconv.Itoa(distPort),
		"-mnesia", "dir", strconv.Quote(spool),
		"-s", "ejabberd", "-noinput")
	deadline := start.Add(ejabberdStartWait)
	started := regexp.MustCompile(`ejabberd (\S+) is started in the node`)
	for {
		select {
		case <-exited:
			t.Fatalf("ejabberd exited during start-up:\n%s", rabbitLogTail(logFile, 80))
		default:
		}
		b, _ := os.ReadFile(logFile)
		if m := started.FindSubmatch(b); m != nil && rabbitListening(listenAddr) {
			e.version = string(m[1])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ejabberd not accepting MQTT connections after %s:\n%s", ejabberdStartWait, rabbitLogTail(logFile, 80))
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.started = time.Since(start)
	e.logFile = logFile
	t.Logf("ejabberd %s (node %s) accepting MQTT on %s after %s", e.version, e.node, listenAddr, e.started.Round(time.Millisecond))
	return e
}

// ejabberdRelay is mqttRelay with a user name and password, which ejabberd
// requires.
func ejabberdRelay(t *testing.T, ob *Outbox, brokerURL string, opts RelayOptions) *Relay {
	t.Helper()
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: brokerURL, ClientID: "relay-" + NewID()[24:], Username: "till-1", Password: ejabberdPassword,
		ConnectTimeout: 2 * time.Second, WriteTimeout: time.Second, KeepAlive: 2 * time.Second, PingTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	return r
}

// startEjabberdSubscriber is startPersistentSubscriber with a user name
// and password.
func startEjabberdSubscriber(t *testing.T, addr, clientID, filter string) *harness.Subscriber {
	t.Helper()
	return harness.StartSubscriber(t, addr, harness.SubscriberOptions{ClientID: clientID, Filter: filter, Username: clientID, Password: ejabberdPassword}, eventIDSeq)
}

// TestEjabberdCompatibility runs the relay's core cases against ejabberd's
// MQTT broker (mod_mqtt): publish in order to a persistent subscriber, an
// outage in the middle of a backlog, and a PUBACK withheld until the
// connection drops.
//
// mod_mqtt keeps a CleanSession=false session (MQTT 3.1.1) for
// session_expiry after its client goes (default 5 minutes), in RAM: a node
// restart loses it. Its queue holds max_queue messages (default 5000); one
// more clears the whole queue and ends the session (mod_mqtt_session.erl).
// It sends a subscriber one QoS 1 message at a time, the next after the
// PUBACK, and acknowledges a publisher's QoS 1 message once it has handed
// it to the subscribers' sessions: here the relay had all 300 PUBACKs when
// the subscriber had about 30.
func TestEjabberdCompatibility(t *testing.T) {
	e := startEjabberd(t)
	sub := startEjabberdSubscriber(t, e.mqttAddr, "consumer", "pos/#")
	p := harness.StartFaultProxy(t, e.mqttAddr)
	ob := openTest(t, Options{})
	r := ejabberdRelay(t, ob, p.URL(), fastRelay())
	startRelay(t, r)

	dups := brokerCases(t, ob, r, p, sub)
	require.Zero(t, sub.SessionsLost(), "the subscriber's session survived")
	t.Logf("ejabberd %s: 401 events delivered in order, %d duplicates, 0 dead (broker start %s)",
		e.version, dups, e.started.Round(100*time.Millisecond))
}

// TestEjabberdDeniedPublishAcknowledged: a publish its access rules refuse
// (access_publish) is acknowledged and dropped, and the connection stays
// up. mod_mqtt answers with a PUBACK whose reason code says "topic name
// invalid", but an MQTT 3.1.1 PUBACK has no reason code: the relay cannot
// tell it from a delivery, so the row is marked sent — as with Mosquitto's
// ACL, and unlike RabbitMQ's topic permissions, which close the
// connection. Unlike Mosquitto, ejabberd does not log it at its default
// level (info). The defence is at the device: topics built from one prefix
// the broker allows.
func TestEjabberdDeniedPublishAcknowledged(t *testing.T) {
	e := startEjabberd(t)
	sub := startEjabberdSubscriber(t, e.mqttAddr, "consumer", "pos/#")
	ob := openTest(t, Options{})
	r := ejabberdRelay(t, ob, "tcp://"+e.mqttAddr, fastRelay())
	startRelay(t, r)

	commitOrder(t, ob, "pos/orders", 1)
	commitOrder(t, ob, "other/orders", 2) // outside the allowed pos/#
	commitOrder(t, ob, "pos/orders", 3)
	eventually(t, 10*time.Second, "all three acknowledged", func() bool { return countState(t, ob, "sent") == 3 })
	eventually(t, 5*time.Second, "the allowed two delivered", func() bool { return sub.Log.Unique() == 2 })
	s, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.True(t, s.Connected, "the connection was not dropped")
	require.Zero(t, countState(t, ob, "dead"))
	// A fence: mod_mqtt routes one connection's publishes in order, so once
	// a later one has arrived the denied one is not on its way.
	commitOrder(t, ob, "pos/orders", 4)
	eventually(t, 5*time.Second, "the fence delivered", func() bool { return sub.Log.Unique() == 3 })
	var deniedID string
	require.NoError(t, ob.DB().QueryRow(`SELECT id FROM outbox WHERE seq = 2`).Scan(&deniedID))
	require.False(t, sub.Log.Has(deniedID), "the denied publish was dropped")
	log, err := os.ReadFile(e.logFile)
	require.NoError(t, err)
	require.NotContains(t, string(log), "other/orders", "not in the log")
	require.NotContains(t, string(log), "forbidden", "not in the log")
	t.Logf("ejabberd %s: a publish outside access_publish acknowledged, dropped, connection kept", e.version)
}
