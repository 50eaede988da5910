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

// ejabberd (the Debian package, 23.01) for its MQTT broker, mod_mqtt. The
// node is owned by the test: ejabberd.yml, the Mnesia spool, logs and a
// HOME with its own Erlang cookie live in the test's directory; it has its
// own node name and loopback ports of its own for MQTT, Erlang distribution
// and epmd. Nothing outlives the test: the harness starts epmd itself as a
// child, and runs the Erlang VM directly rather than through
// /usr/sbin/ejabberdctl, which as root switches to the ejabberd user (who
// cannot enter the test's directories) and keeps the VM as a grandchild
// behind a shell. /usr/bin/erl execs the VM, so our child is the node, and
// both are stopped by PID.
//
// Logging in: ejabberd maps an MQTT client to a JID, user@host/client-id
// (the user is the CONNECT user name, or the client id when there is none),
// and checks the password with the host's auth_method. An empty password is
// never checked against it: it means certificate authentication (a TLS
// listener with tls_verify, the client certificate's CN naming the user),
// and without one the CONNECT is refused with CONNACK 5. So the plain
// listener's clients log in with a user name and a password, which
// anonymous login (auth_method anonymous, anonymous_protocol login_anon)
// accepts, whatever they are.

// a cold start is ~1 s here
const ejabberdStartWait = 90 * time.Second

// EjabberdPassword is any non-empty password: anonymous login takes any.
const EjabberdPassword = "outbox-test"

// ejabberdInstall finds the Erlang runtime and ejabberd's code: erl, and
// the directory holding ejabberd-<version>/ebin (ERL_LIBS). Debian puts it
// in /usr/lib/<triplet>.
func ejabberdInstall() (erl, libs string) {
	erl, err := exec.LookPath("erl")
	if err != nil {
		if !executable("/usr/lib/erlang/bin/erl") {
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

// Ejabberd is one ejabberd node owned by a test.
type Ejabberd struct {
	MQTTAddr    string // the plain listener; "" with TLS
	MQTTTLSAddr string // the TLS listener, with EjabberdOptions.TLS only
	Node        string
	Version     string
	Started     time.Duration // from exec to accepting MQTT connections
	LogFile     string        // the node's console output: its log
}

// EjabberdOptions shape a node. With TLS, the node has a TLS listener only
// (tls_verify: a client certificate from the CA logs in as the user its CN
// names) and no password logins at all (auth_method internal, no users),
// so a client certificate is required. Without it, a plain listener and
// anonymous login. Either way clients publish and subscribe under pos/ and
// nowhere else.
type EjabberdOptions struct {
	TLS *ServerTLS
}

// StartEjabberd starts an ejabberd node that lives as long as tb, skipping
// tb if ejabberd is not installed.
func StartEjabberd(tb TB, o EjabberdOptions) *Ejabberd {
	tb.Helper()
	erl, libs := ejabberdInstall()
	if erl == "" {
		tb.Skipf("ejabberd is not installed: apt-get install -y ejabberd")
	}
	epmd := needEpmd(tb, "ejabberd")
	dir := tb.TempDir()
	ports := freePorts(tb, 3)
	mqttPort, distPort, epmdPort := ports[0], ports[1], ports[2]
	e := &Ejabberd{Node: fmt.Sprintf("outbox-ejabberd-%d@localhost", mqttPort)}
	listenAddr := loopback(mqttPort)

	spool, logs := filepath.Join(dir, "spool"), filepath.Join(dir, "log")
	for _, d := range []string{spool, logs} {
		must(tb, os.Mkdir(d, 0o700), "ejabberd directories")
	}
	// Name resolution for the node's host part: localhost, nothing else
	// (Debian's /etc/ejabberd/inetrc, kept here so that /etc is not needed).
	inetrc := filepath.Join(dir, "inetrc")
	must(tb, os.WriteFile(inetrc, []byte("{lookup,[\"file\",\"native\"]}.\n{host,{127,0,0,1},[\"localhost\"]}.\n"), 0o600), "inetrc")

	var conf strings.Builder
	conf.WriteString("hosts:\n  - localhost\nloglevel: info\nlog_rotate_count: 0\nhide_sensitive_log_data: false\n")
	// Nothing of the node's reaches out: no ACME certificate requests.
	conf.WriteString("acme:\n  auto: false\n")
	listener := fmt.Sprintf("listen:\n  - port: %d\n    ip: \"127.0.0.1\"\n    module: mod_mqtt\n", mqttPort)
	if o.TLS != nil {
		e.MQTTTLSAddr = listenAddr
		// ca_file is what the node checks its own certificate against;
		// c2s_cafile, client certificates.
		fmt.Fprintf(&conf, "auth_method: [internal]\ncertfiles:\n  - %q\n  - %q\nca_file: %q\nc2s_cafile: %q\n", o.TLS.CertFile, o.TLS.KeyFile, o.TLS.CAFile, o.TLS.CAFile)
		listener += "    tls: true\n    tls_verify: true\n"
	} else {
		e.MQTTAddr = listenAddr
		conf.WriteString("auth_method: [anonymous]\nanonymous_protocol: login_anon\nallow_multiple_connections: true\n")
	}
	conf.WriteString(listener)
	conf.WriteString("modules:\n  mod_mqtt:\n")
	// access_publish and access_subscribe are allow-lists: once a topic
	// filter is listed, a topic none of them matches is refused.
	conf.WriteString("    access_publish:\n      \"pos/#\": all\n    access_subscribe:\n      \"pos/#\": all\n")
	confFile := filepath.Join(dir, "ejabberd.yml")
	must(tb, os.WriteFile(confFile, []byte(conf.String()), 0o600), "ejabberd.yml")

	env := append(erlangEnv(tb, dir, epmd, epmdPort, "EJABBERD", "CONTRIB_MODULES"),
		"ERL_INETRC="+inetrc,
		"ERL_LIBS="+libs,
		"EJABBERD_CONFIG_PATH="+confFile,
		"EJABBERD_LOG_PATH="+filepath.Join(logs, "ejabberd.log"),
		"CONTRIB_MODULES_PATH="+filepath.Join(dir, "contrib"),
		"CONTRIB_MODULES_CONF_DIR="+filepath.Join(dir, "contrib-conf"),
	)

	// What ejabberdctl foreground runs, minus the user switch and the
	// shell: the node logs to stdout as well as to its log file.
	e.LogFile = filepath.Join(dir, "ejabberd.console")
	start := time.Now()
	p := startProcess(tb, "ejabberd", e.LogFile, dir, env, erlangStopWait, erl,
		"-sname", e.Node, "-start_epmd", "false",
		"-kernel", "inet_dist_use_interface", "{127,0,0,1}",
		"-kernel", "inet_dist_listen_min", strconv.Itoa(distPort),
		"-kernel", "inet_dist_listen_max", strconv.Itoa(distPort),
		"-mnesia", "dir", strconv.Quote(spool),
		"-s", "ejabberd", "-noinput")
	started := regexp.MustCompile(`ejabberd (\S+) is started in the node`)
	p.waitReady(tb, ejabberdStartWait, func(log []byte) bool {
		m := started.FindSubmatch(log)
		if m == nil || !listening(listenAddr) {
			return false
		}
		e.Version = string(m[1])
		return true
	})
	e.Started = time.Since(start)
	tb.Logf("ejabberd %s (node %s) accepting MQTT on %s after %s", e.Version, e.Node, listenAddr, e.Started.Round(time.Millisecond))
	return e
}
