package harness

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Erlang nodes (RabbitMQ, ejabberd) are owned by the test like any broker:
// a HOME with its own cookie, an epmd of the test's own, a node name and
// ports of their own, and nothing that outlives the test. A node left to
// itself would spawn "epmd -daemon", which would.

// erlangStopWait bounds a node's orderly shutdown.
const erlangStopWait = 20 * time.Second

// epmdBinary finds Erlang's port mapper; "" if Erlang is not installed.
func epmdBinary() string {
	if p, err := exec.LookPath("epmd"); err == nil {
		return p
	}
	if p := "/usr/lib/erlang/bin/epmd"; executable(p) {
		return p
	}
	return ""
}

// needEpmd returns epmd, skipping tb if it is not installed; pkg is the
// package that would bring it.
func needEpmd(tb TB, pkg string) string {
	tb.Helper()
	epmd := epmdBinary()
	if epmd == "" {
		tb.Skipf("epmd (Erlang) is not installed: apt-get install -y %s", pkg)
	}
	return epmd
}

// erlangEnv prepares what every Erlang node a test starts needs, in dir: a
// HOME with a cookie only its owner can read, and an epmd of its own on
// epmdPort, started as the test's child. It returns the node's
// environment: the caller's, without its Erlang settings, its HOME, its
// systemd socket and any variable with one of the drop prefixes (they
// could point the node at a system-wide epmd, cookie or config).
func erlangEnv(tb TB, dir, epmd string, epmdPort int, drop ...string) []string {
	tb.Helper()
	home := filepath.Join(dir, "home")
	must(tb, os.Mkdir(home, 0o700), "HOME")
	cookie := make([]byte, 16)
	_, err := rand.Read(cookie)
	must(tb, err, "cookie")
	// Erlang refuses a cookie file that others can read.
	must(tb, os.WriteFile(filepath.Join(home, ".erlang.cookie"), []byte(strings.ToUpper(hex.EncodeToString(cookie))), 0o400), "cookie")

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
	startProcess(tb, "epmd", filepath.Join(dir, "epmd.log"), dir, env, erlangStopWait, epmd, "-port", strconv.Itoa(epmdPort), "-address", "127.0.0.1")
	epmdAddr := loopback(epmdPort)
	Eventually(tb, 10*time.Second, "epmd listening", func() bool { return listening(epmdAddr) })
	return env
}
