package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// relayGoodBadGood commits messages 1, 2 and 3 on topics good, bad and
// good, and runs a relay with maxAttempts whose publisher refuses the bad
// one with refusal, until the good ones are sent and the bad one dead.
func relayGoodBadGood(t *testing.T, refusal error, maxAttempts int) (*Outbox, *fakePublisher) {
	t.Helper()
	ob := openTest(t, Options{})
	pub := &fakePublisher{reject: func(topic string) error {
		if topic == "bad" {
			return refusal
		}
		return nil
	}}
	opts := fastRelay()
	opts.Retry = fastRetry(maxAttempts)
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	commitOrder(t, ob, "good", 1)
	commitOrder(t, ob, "bad", 2)
	commitOrder(t, ob, "good", 3)
	startRelay(t, r)
	eventually(t, 10*time.Second, "good ones sent, bad one dead", func() bool {
		return countState(t, ob, "sent") == 2 && countState(t, ob, "dead") == 1
	})
	return ob, pub
}

// A message the broker refuses blames that message only: the connection
// stays up (no outage rule, no reconnection), the message is retried with
// Retry backoff until MaxAttempts, and the ones behind it flow on after it
// is settled.
func TestRelayRejectionKeepsConnection(t *testing.T) {
	ob, pub := relayGoodBadGood(t, fmt.Errorf("%w: quota exceeded (0x97)", ErrRejected), 3)
	state, attempts := rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	require.Equal(t, 3, attempts)
	require.Equal(t, 1, pub.connectCount(), "a refused message is not an outage: the connection is kept")
}

// A refusal that retrying cannot change (ErrUndeliverable: MQTT 5's not
// authorized, topic name invalid, ...) parks the message dead at once, on
// the same connection, and the messages behind it are delivered once each.
func TestRelayUndeliverableDeadAtOnce(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{reject: func(topic string) error {
		if topic == "denied" {
			return fmt.Errorf("%w: %w: not authorized (0x87)", ErrRejected, ErrUndeliverable)
		}
		return nil
	}}
	opts := fastRelay()
	opts.Retry = fastRetry(5)
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	for i := 1; i <= 10; i++ {
		topic := "good"
		if i == 4 {
			topic = "denied"
		}
		commitOrder(t, ob, topic, i)
	}
	startRelay(t, r)
	eventually(t, 10*time.Second, "nine sent, one dead", func() bool {
		return countState(t, ob, "sent") == 9 && countState(t, ob, "dead") == 1
	})
	state, attempts := rowState(t, ob, 4)
	require.Equal(t, "dead", state)
	require.Equal(t, 1, attempts, "dead at the first refusal")
	var lastErr string
	require.NoError(t, ob.DB().QueryRow(`SELECT last_error FROM outbox WHERE seq = 4`).Scan(&lastErr))
	require.Contains(t, lastErr, "not authorized (0x87)")
	pub.mu.Lock()
	defer pub.mu.Unlock()
	require.Equal(t, 1, pub.connects)
	var ns []int
	for _, p := range pub.published {
		ev, err := DecodeEvent([]byte(p))
		require.NoError(t, err)
		var n struct{ N int }
		require.NoError(t, json.Unmarshal(ev.Data, &n))
		ns = append(ns, n.N)
	}
	require.Equal(t, []int{1, 2, 3, 5, 6, 7, 8, 9, 10}, ns, "in order, once each")
	st, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, st.DeadSince)
}
