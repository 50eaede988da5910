package consumer

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// The producer side, as the consumer's tests need it: outboxes of tills
// relaying through the public API to an in-process broker, over each MQTT
// version.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testLogger keeps test output quiet unless OUTBOX_TEST_LOG is set.
func testLogger() *slog.Logger { return harness.TestLogger() }

// eventually waits for cond, polling, and fails the test at the deadline.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	harness.Eventually(t, timeout, what, cond)
}

// forProtocols runs test under each MQTT version the consumer speaks.
func forProtocols(t *testing.T, test func(t *testing.T, proto outbox.MQTTProtocol)) {
	t.Helper()
	for _, proto := range []outbox.MQTTProtocol{outbox.Protocol5, outbox.Protocol311} {
		t.Run("mqtt "+proto.String(), func(t *testing.T) { test(t, proto) })
	}
}

// openTest opens a till's outbox in the test's directory, with an orders
// table beside it.
func openTest(t testing.TB, opts outbox.Options) *outbox.Outbox {
	t.Helper()
	opts.Logger = testLogger()
	ob, err := outbox.Open(context.Background(), filepath.Join(t.TempDir(), "till.db"), opts)
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	_, err = ob.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	require.NoError(t, err)
	return ob
}

// commitOrder commits order n and its event to topic, in one transaction.
func commitOrder(t testing.TB, ob *outbox.Outbox, topic string, n int) {
	t.Helper()
	require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
		if _, err := tx.Exec(`INSERT INTO orders (item) VALUES (?)`, fmt.Sprint("item-", n)); err != nil {
			return err
		}
		return ob.Enqueue(context.Background(), tx, outbox.Message{Topic: topic, Payload: fmt.Appendf(nil, `{"n":%d}`, n)})
	}))
}

// countState counts the till's outbox rows in state.
func countState(t testing.TB, ob *outbox.Outbox, state string) (n int) {
	t.Helper()
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox_messages WHERE state = ?`, state).Scan(&n))
	return n
}

// fastRelay is a till's relay that reconnects and gives up on a missing
// acknowledgement quickly.
func fastRelay() outbox.RelayOptions {
	quick := outbox.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	return outbox.RelayOptions{Source: "/test/device", Reconnect: quick, AckTimeout: 2 * time.Second,
		LeaseTTL: 2 * time.Second, ShutdownTimeout: 2 * time.Second}
}

// startRelay runs r until the test ends and checks that Run returned nil.
func startRelay(t testing.TB, r *outbox.Relay) (stop func()) {
	t.Helper()
	return harness.RunInBackground(t, "relay", r)
}

// mqttRelay is a relay from ob to the broker at url, speaking auto.
func mqttRelay(t testing.TB, ob *outbox.Outbox, url string, opts outbox.RelayOptions) *outbox.Relay {
	t.Helper()
	return mqttRelayOn(t, ob, url, opts, outbox.ProtocolAuto)
}

// mqttRelayOn is mqttRelay speaking proto.
func mqttRelayOn(t testing.TB, ob *outbox.Outbox, url string, opts outbox.RelayOptions, proto outbox.MQTTProtocol) *outbox.Relay {
	t.Helper()
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: url, ClientID: "till-" + outbox.NewID()[24:],
		ConnectTimeout: 2 * time.Second, KeepAlive: 2 * time.Second, PingTimeout: time.Second, Protocol: proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	return r
}

// delivery is a message the broker routed, as the recorder keeps it.
type delivery struct {
	topic   string
	payload []byte
}

// broker is an in-process mochi broker on a free loopback port with a
// recorder subscribed to every topic.
type broker struct {
	srv  *mochi.Server
	addr string
	rec  *harness.Recorder[delivery]
}

func startBroker(t testing.TB) *broker {
	t.Helper()
	m := harness.StartMochi(t, harness.MochiOptions{})
	rec, err := harness.Record(m, "#", func(m harness.Message) delivery { return delivery{m.Topic, m.Payload} })
	require.NoError(t, err)
	return &broker{srv: m.Server(), addr: m.Addr(), rec: rec}
}

func (b *broker) url() string { return "tcp://" + b.addr }
