package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/harness/natsauth"
)

// TestRelayToNATS: --broker nats://, repeated for a cluster (the first one
// down), publishes each event into the stream that captures its subject,
// with its id as Nats-Msg-Id, in commit order.
func TestRelayToNATS(t *testing.T) {
	n := harness.StartNATS(t)
	nc, err := nats.Connect("nats://" + n.Addr)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SHOP", Subjects: []string{"shop.>"}, Duplicates: 2 * time.Minute})
	require.NoError(t, err)

	path := filepath.Join(t.TempDir(), "shop.db")
	cmd := exec.Command(binary, "relay", "--db", path, "--broker", "nats://127.0.0.1:1", "--broker", "nats://"+n.Addr,
		"--backoff-max", "200ms", "--log-format", "json")
	var stderr harness.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	db := openCreated(t, path, &stderr)
	for i := range 5 {
		_, err := db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('shop/sales', ?)`, fmt.Sprintf(`{"sale":%d}`, i))
		require.NoError(t, err)
	}
	var ids []string
	rows, err := db.Query(`SELECT id FROM outbox ORDER BY seq`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	require.True(t, harness.WaitFor(20*time.Second, func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 5
	}), "not delivered: %s", stderr.String())
	var got []string
	for seq := uint64(1); seq <= 5; seq++ {
		m, err := st.GetMsg(ctx, seq)
		require.NoError(t, err)
		require.Equal(t, "shop.sales", m.Subject)
		got = append(got, m.Header.Get(jetstream.MsgIDHeader))
	}
	require.Equal(t, ids, got, "every event once, in commit order, its id as Nats-Msg-Id")
	// status, another process, names the protocol, not an MQTT version.
	r := ctl(t, "status", "--db", path)
	require.Regexp(t, `(?m)^protocol\s+NATS JetStream$`, r.Stdout)
	stopRelay(t, cmd, &stderr)
}

// TestRelayNATSUsage: what only MQTT has is refused with nats://.
func TestRelayNATSUsage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	for args, want := range map[string][]string{
		"--broker: mix of nats:// and MQTT URLs":    {"--broker", "nats://127.0.0.1:1", "--broker", "tcp://127.0.0.1:1"},
		"--batch-max-* and --compress are MQTT's":   {"--broker", "nats://127.0.0.1:1", "--compress", "gzip"},
		"--commands is MQTT's":                      {"--broker", "nats://127.0.0.1:1", "--commands", "cmd/#"},
		"are NATS's: not with an MQTT broker":       {"--broker", "tcp://127.0.0.1:1", "--nats-creds-file", "till.creds"},
		"give one of --username, --nats-token-file": {"--broker", "nats://127.0.0.1:1", "--username", "till7", "--nats-nkey-file", "till.nk"},
		"--nats-token-file: the file is empty":      {"--broker", "nats://127.0.0.1:1", "--nats-token-file", "/dev/null"},
		"--nats-creds-file: open":                   {"--broker", "nats://127.0.0.1:1", "--nats-creds-file", "/nonexistent/till.creds"},
		"they need nats:// brokers":                 {"--broker", "tcp://127.0.0.1:1", "--create-stream", "POS", "--stream-subject", "pos.>"},
		"--stream-* need --create-stream":           {"--broker", "nats://127.0.0.1:1", "--stream-subject", "pos.>"},
		`CreateStream "POS": no subjects`:           {"--broker", "nats://127.0.0.1:1", "--create-stream", "POS"},
		"longer than MaxAge":                        {"--broker", "nats://127.0.0.1:1", "--create-stream", "POS", "--stream-subject", "pos.>", "--stream-max-age", "1m", "--stream-duplicate-window", "2m"},
	} {
		r := ctl(t, append([]string{"relay", "--db", path}, want...)...)
		require.Equal(t, 2, r.Code, r.Stderr)
		require.Contains(t, r.Stderr, args)
	}
	require.NoFileExists(t, path, "a relay that cannot start leaves no file")
}

// TestRelayCreatesStream: with --create-stream the relay creates the stream
// the flags describe at its connection, and publishes into it.
func TestRelayCreatesStream(t *testing.T) {
	n := harness.StartNATS(t)
	nc, err := nats.Connect("nats://" + n.Addr)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()

	path := filepath.Join(t.TempDir(), "shop.db")
	cmd := exec.Command(binary, "relay", "--db", path, "--broker", "nats://"+n.Addr, "--create-stream", "SHOP",
		"--stream-subject", "shop.>", "--stream-subject", "till.>", "--stream-max-bytes", "1048576",
		"--stream-max-age", "1h", "--stream-duplicate-window", "5m", "--log-format", "json")
	var stderr harness.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var st jetstream.Stream
	require.True(t, harness.WaitFor(10*time.Second, func() bool {
		st, err = js.Stream(ctx, "SHOP")
		return err == nil
	}), "no stream created: %v %s", err, stderr.String())
	cfg := st.CachedInfo().Config
	require.Equal(t, []string{"shop.>", "till.>"}, cfg.Subjects)
	require.EqualValues(t, 1<<20, cfg.MaxBytes)
	require.Equal(t, time.Hour, cfg.MaxAge)
	require.Equal(t, 5*time.Minute, cfg.Duplicates)
	require.Equal(t, jetstream.DiscardNew, cfg.Discard)
	require.Equal(t, jetstream.FileStorage, cfg.Storage)

	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('till/sales', '{"sale":1}')`)
	require.NoError(t, err)
	var id string
	require.NoError(t, db.QueryRow(`SELECT id FROM outbox`).Scan(&id))
	require.True(t, harness.WaitFor(10*time.Second, func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 1
	}), "not delivered: %s", stderr.String())
	m, err := st.GetMsg(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, id, m.Header.Get(jetstream.MsgIDHeader))
	require.Contains(t, stderr.String(), "natsjs: created the stream")
	stopRelay(t, cmd, &stderr)
}

// TestRelayNATSCredentials: the relay logs in to nats-server with each way
// a fleet gives its tills — a token, an NKey seed, a creds file (operator
// mode), mutual TLS — read from files; a wrong token is refused, the
// relay's log saying so and holding neither token.
func TestRelayNATSCredentials(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(s), 0o600))
		return p
	}
	nk := natsauth.NewNKeyUser(t)
	op := natsauth.NewOperator(t)
	creds := op.Creds(t, "till-7")
	pki := harness.NewBrokerTLS(t)
	clientTLS, err := outbox.TLSFiles{CAFile: pki.CAFile, CertFile: pki.Client.CertFile, KeyFile: pki.Client.KeyFile}.Config()
	require.NoError(t, err)
	for _, c := range []struct {
		name  string
		conf  []string
		admin nats.Option
		args  []string
	}{
		{"token", []string{`authorization { token: "t0ken-s3cret" }`}, nats.Token("t0ken-s3cret"),
			[]string{"--nats-token-file", write("token", "t0ken-s3cret\n")}},
		{"NKey seed file", []string{fmt.Sprintf("authorization { users: [ { nkey: %s } ] }", nk.Public)}, nkeyOption(t, nk.SeedFile),
			[]string{"--nats-nkey-file", nk.SeedFile}},
		{"creds file", op.Conf(), nats.UserCredentials(creds),
			[]string{"--nats-creds-file", creds}},
		{"mutual TLS", []string{fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }", pki.Server.CertFile, pki.Server.KeyFile, pki.CAFile)}, nats.Secure(clientTLS),
			[]string{"--ca-file", pki.CAFile, "--cert-file", pki.Client.CertFile, "--key-file", pki.Client.KeyFile}},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := harness.StartNATSWith(t, c.conf)
			relayDeliversToNATS(t, n.Addr, c.admin, c.args...)
		})
	}

	t.Run("wrong token", func(t *testing.T) {
		n := harness.StartNATSWith(t, []string{`authorization { token: "t0ken-s3cret" }`})
		cmd := exec.Command(binary, "relay", "--db", filepath.Join(t.TempDir(), "shop.db"), "--broker", "nats://"+n.Addr,
			"--nats-token-file", write("wrong", "t0ken-wr0ng"), "--backoff-max", "200ms", "--log-format", "json")
		var stderr harness.LogBuffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		require.True(t, harness.WaitFor(10*time.Second, func() bool {
			return strings.Contains(stderr.String(), "Authorization Violation")
		}), "the refusal is not logged: %s", stderr.String())
		require.Contains(t, stderr.String(), "logging in with a token")
		require.NotContains(t, stderr.String(), "t0ken-wr0ng")
		require.NotContains(t, stderr.String(), "t0ken-s3cret")
		stopRelay(t, cmd, &stderr)
	})
}

// relayDeliversToNATS runs the relay with args into the nats-server at
// addr, which the test's own connection logs in to with admin to make the
// stream, and checks that an event committed reaches it.
func relayDeliversToNATS(t *testing.T, addr string, admin nats.Option, args ...string) {
	t.Helper()
	nc, err := nats.Connect("nats://"+addr, admin)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SHOP", Subjects: []string{"shop.>"}})
	require.NoError(t, err)

	path := filepath.Join(t.TempDir(), "shop.db")
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer ob.Close()
	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
		return ob.Enqueue(ctx, tx, outbox.Message{Topic: "shop/sales", Payload: []byte(`{"sale":1}`)})
	}))
	recs, err := ob.List(ctx, outbox.ListOptions{})
	require.NoError(t, err)
	cmd := exec.Command(binary, append([]string{"relay", "--db", path, "--broker", "nats://" + addr, "--backoff-max", "200ms", "--log-format", "json"}, args...)...)
	var stderr harness.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	require.True(t, harness.WaitFor(10*time.Second, func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 1
	}), "not delivered: %s", stderr.String())
	m, err := st.GetMsg(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, recs[0].ID, m.Header.Get(jetstream.MsgIDHeader))
	stopRelay(t, cmd, &stderr)
}

func nkeyOption(t *testing.T, seedFile string) nats.Option {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(seedFile)
	require.NoError(t, err)
	return o
}

// TestDoctorNATS: doctor --broker nats://… tries the NATS servers as the
// relay would, with its credentials: it says it connected and speaks NATS
// JetStream, or why not, naming the credential but never the secret.
func TestDoctorNATS(t *testing.T) {
	n := harness.StartNATSWith(t, []string{`authorization { token: "t0ken-s3cret" }`})
	path := closedOutbox(t)
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(good, []byte("t0ken-s3cret\n"), 0o600))
	require.NoError(t, os.WriteFile(bad, []byte("wr0ng-s3cret\n"), 0o600))

	code, _, by := doctorFindings(t, "--db", path, "--broker", "nats://127.0.0.1:1", "--broker", "nats://"+n.Addr, "--nats-token-file", good)
	require.Equal(t, levelOK, by["broker"].Level, "%+v", by["broker"])
	require.Equal(t, "connected to nats://"+n.Addr+" (NATS JetStream)", by["broker"].Found)
	require.Zero(t, code)

	code, _, by = doctorFindings(t, "--db", path, "--broker", "nats://"+n.Addr, "--nats-token-file", bad)
	require.Equal(t, 1, code)
	require.Equal(t, levelAct, by["broker"].Level)
	require.Equal(t, "cannot connect to nats://"+n.Addr+": logging in with a token: nats: Authorization Violation", by["broker"].Found)
	require.Contains(t, by["broker"].Do, "refused the login")
}
