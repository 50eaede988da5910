package integration

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// testLogger keeps test output quiet unless OUTBOX_TEST_LOG is set.
func testLogger() *slog.Logger { return harness.TestLogger() }

// openTest opens an outbox in the test's directory, with an orders table
// for the business rows.
func openTest(t testing.TB, opts outbox.Options) *outbox.Outbox {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger()
	}
	ob, err := outbox.Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"), opts)
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	_, err = ob.DB().Exec(`CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	require.NoError(t, err)
	return ob
}

// commitOrder writes a business row and its event in one transaction.
func commitOrder(t testing.TB, ob *outbox.Outbox, topic string, n int) {
	t.Helper()
	err := ob.Transact(context.Background(), func(tx *sql.Tx) error {
		if _, err := tx.Exec(`INSERT INTO orders (item) VALUES (?)`, fmt.Sprint("item-", n)); err != nil {
			return err
		}
		return ob.Enqueue(context.Background(), tx, outbox.Message{Topic: topic, Payload: fmt.Appendf(nil, `{"n":%d}`, n)})
	})
	require.NoError(t, err)
}

// fastRelay returns relay options that make tests quick: short backoffs and
// timeouts.
func fastRelay() outbox.RelayOptions {
	return outbox.RelayOptions{
		Source:          "/test/device",
		Reconnect:       outbox.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		Retry:           fastRetry(0),
		AckTimeout:      2 * time.Second,
		LeaseTTL:        2 * time.Second,
		ShutdownTimeout: 2 * time.Second,
	}
}

// startRelay runs r until the test ends and checks that Run returned nil.
func startRelay(t testing.TB, r *outbox.Relay) (stop func()) {
	t.Helper()
	return harness.RunInBackground(t, "relay", r)
}

// rowState returns the state of the row with the given sequence number.
func rowState(t testing.TB, ob *outbox.Outbox, seq int64) (state string, attempts int) {
	t.Helper()
	require.NoError(t, ob.DB().QueryRow(`SELECT state, attempts FROM outbox_messages WHERE seq = ?`, seq).Scan(&state, &attempts))
	return state, attempts
}

func countState(t testing.TB, ob *outbox.Outbox, state string) int {
	t.Helper()
	var n int
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox_messages WHERE state = ?`, state).Scan(&n))
	return n
}

// eventIDSeq reads an event's id and sequence for a harness.EventLog.
func eventIDSeq(payload []byte) (string, int64, error) {
	ev, err := outbox.DecodeEvent(payload)
	return ev.ID, ev.Sequence, err
}

// fastRetry is the retry policy of fastRelay with maxAttempts (0: the
// default).
func fastRetry(maxAttempts int) outbox.RetryPolicy {
	return outbox.DefaultRetryPolicy{Backoff: outbox.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}, MaxAttempts: maxAttempts}
}
