package main

import (
	"context"
	"database/sql"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
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
	var db *sql.DB
	require.True(t, harness.WaitFor(10*time.Second, func() bool {
		if db == nil {
			db, err = sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
			require.NoError(t, err)
		}
		_, err = db.Exec(`SELECT 1 FROM outbox LIMIT 1`)
		return err == nil
	}), "schema never created: %s", stderr.String())
	defer db.Close()
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
	stopRelay(t, cmd, &stderr)
}

// TestRelayNATSUsage: what only MQTT has is refused with nats://.
func TestRelayNATSUsage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	for args, want := range map[string][]string{
		"--broker: mix of nats:// and MQTT URLs":  {"--broker", "nats://127.0.0.1:1", "--broker", "tcp://127.0.0.1:1"},
		"--batch-max-* and --compress are MQTT's": {"--broker", "nats://127.0.0.1:1", "--compress", "gzip"},
		"--commands is MQTT's":                    {"--broker", "nats://127.0.0.1:1", "--commands", "cmd/#"},
		"they need nats:// brokers":               {"--broker", "tcp://127.0.0.1:1", "--create-stream", "POS", "--stream-subject", "pos.>"},
		"--stream-* need --create-stream":         {"--broker", "nats://127.0.0.1:1", "--stream-subject", "pos.>"},
		`CreateStream "POS": no subjects`:         {"--broker", "nats://127.0.0.1:1", "--create-stream", "POS"},
		"longer than MaxAge":                      {"--broker", "nats://127.0.0.1:1", "--create-stream", "POS", "--stream-subject", "pos.>", "--stream-max-age", "1m", "--stream-duplicate-window", "2m"},
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
