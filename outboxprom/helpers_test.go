package outboxprom

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// rig is an outbox whose relay publishes to a mochi broker through a fault
// proxy, exported by an Exporter served on a loopback listener (srv), and
// by the same exporter's monitor as the till's outboxctl serves it, its
// /metrics written without Prometheus's client, on another (till).
type rig struct {
	ob    *outbox.Outbox
	relay *outbox.Relay
	proxy *harness.FaultProxy
	exp   *Exporter
	srv   *httptest.Server
	till  *httptest.Server
	stop  func()
}

type rigOptions struct {
	exporter Options
	// reconnect is the relay's wait between connection attempts; zero:
	// 20 to 200 ms.
	reconnect outbox.Backoff
}

func startRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	ctx := context.Background()
	ob, err := outbox.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"), outbox.Options{Logger: harness.TestLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	_, err = ob.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	require.NoError(t, err)
	m := harness.StartMochi(t, harness.MochiOptions{Hooks: nil})
	proxy := harness.StartFaultProxy(t, m.Addr())
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: proxy.URL(), ClientID: "outboxprom-test", Logger: harness.TestLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	if o.reconnect == (outbox.Backoff{}) {
		o.reconnect = outbox.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}
	}
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{
		Source:     "/test/till-7",
		Reconnect:  o.reconnect,
		AckTimeout: 2 * time.Second,
		LeaseTTL:   4 * time.Second,
	})
	require.NoError(t, err)
	o.exporter.Relay = relay
	if o.exporter.Logger == nil {
		o.exporter.Logger = harness.TestLogger()
	}
	exp := New(ob, o.exporter)
	t.Cleanup(exp.Close)
	srv := httptest.NewServer(exp.Handler())
	t.Cleanup(srv.Close)
	till := httptest.NewServer(exp.mon.Handler(exp.mon.TextMetrics()))
	t.Cleanup(till.Close)
	r := &rig{ob: ob, relay: relay, proxy: proxy, exp: exp, srv: srv, till: till}
	r.stop = harness.RunInBackground(t, "relay", relay)
	return r
}

// commit writes n orders, each with its event, one transaction each.
func (r *rig) commit(t *testing.T, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		err := r.ob.Transact(ctx, func(tx *sql.Tx) error {
			if _, err := tx.Exec(`INSERT INTO orders (item) VALUES (?)`, fmt.Sprint("item-", i)); err != nil {
				return err
			}
			return r.ob.Enqueue(ctx, tx, outbox.Message{Topic: "till-7/orders", Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
		})
		require.NoError(t, err)
	}
}

// get fetches path from the rig's outboxprom listener.
func (r *rig) get(t *testing.T, path string) (int, string) {
	t.Helper()
	return fetch(t, r.srv, path)
}

// fetch fetches path from srv.
func fetch(t *testing.T, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// metricValue returns the value of an unlabelled sample in a text
// exposition, failing if it is not there.
func metricValue(t *testing.T, text, name string) string {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	t.Fatalf("no sample %s in:\n%s", name, text)
	return ""
}
