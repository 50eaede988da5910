package outbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// noSubscriberHook makes mochi answer as Mosquitto does: an MQTT 5 publish
// whose topic no subscription matches gets PUBACK 0x10.
type noSubscriberHook struct {
	mochi.HookBase
	srv atomic.Pointer[mochi.Server]
}

func (h *noSubscriberHook) ID() string { return "no-subscriber" }
func (h *noSubscriberHook) Provides(b byte) bool {
	return b == mochi.OnPublish || b == mochi.OnPacketEncode
}

// OnPacketEncode works around mochi, which leaves out a PUBACK's reason
// code below 0x80 unless the PUBACK has properties: a PUBACK whose code is
// left out is a success (0x00).
func (h *noSubscriberHook) OnPacketEncode(_ *mochi.Client, pk packets.Packet) packets.Packet {
	return withReasonCode(pk)
}
func (h *noSubscriberHook) OnPublish(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	s := h.srv.Load().Topics.Subscribers(pk.TopicName)
	if len(s.Subscriptions)+len(s.Shared)+len(s.InlineSubscriptions) == 0 {
		return pk, packets.CodeNoMatchingSubscribers
	}
	return pk, nil
}

// TestNoSubscribers: messages the broker takes with no subscriber (PUBACK
// 0x10) are sent, and counted: the total, the last topic and when, in
// Metrics and Stats, and one warning per topic in the log however many
// come. The subscribed topic's stream is every message once, in commit
// order.
func TestNoSubscribers(t *testing.T) {
	h := &noSubscriberHook{}
	m := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(auth.AllowHook), h}})
	h.srv.Store(m.Server())
	rec, err := harness.Record(m, "stores/1/#", decodeDelivery)
	require.NoError(t, err)
	var logs harness.LogBuffer
	ob := openTest(t, Options{Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	r := mqttRelayOn(t, ob, m.URL(), fastRelay(), Protocol5)

	// seq 1, 4, 7…: heard; the others to nobody, the last on stores/3.
	var heard []int64
	for i := 1; i <= 21; i++ {
		topic := "stores/1/orders"
		switch i % 3 {
		case 2:
			topic = "stores/2/orders"
		case 0:
			topic = "stores/3/orders"
		default:
			heard = append(heard, int64(i))
		}
		commitOrder(t, ob, topic, i)
	}
	before := time.Now()
	startRelay(t, r)
	eventually(t, 10*time.Second, "every message sent", func() bool { return r.Metrics().Published == 21 })
	require.Equal(t, 21, countState(t, ob, "sent"))
	eventually(t, 5*time.Second, "the heard ones routed", func() bool { return len(rec.All()) >= len(heard) })
	seqs, dups := firstDeliveries(rec)
	require.Equal(t, heard, seqs, "every heard message once, in commit order")
	require.Zero(t, dups)

	rm := r.Metrics()
	require.EqualValues(t, 14, rm.NoSubscribers)
	require.Equal(t, "stores/3/orders", rm.NoSubscribersTopic)
	require.WithinRange(t, rm.NoSubscribersAt, before.Add(-time.Second), time.Now())
	st, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 14, st.NoSubscribers)
	require.Equal(t, "stores/3/orders", st.NoSubscribersTopic)
	// The lease tells another process's outboxctl status: at the warnings,
	// and at the renewals while the count moves.
	eventually(t, 10*time.Second, "the lease has the count", func() bool {
		s, err := ob.Stats(context.Background())
		require.NoError(t, err)
		return s.LeaseNoSubscribers == 14 && s.LeaseNoSubscribersTopic == "stores/3/orders" && !s.LeaseNoSubscribersAt.IsZero()
	})

	var warned []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if line == "" {
			continue
		}
		var rec struct{ Msg, Topic string }
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if strings.Contains(rec.Msg, "no subscriber") {
			warned = append(warned, rec.Topic)
		}
	}
	require.Equal(t, []string{"stores/2/orders", "stores/3/orders"}, warned, "once per topic: %s", logs.String())
}

// TestNoSubscribersWarnsBounded: the warnings' memory holds at most
// noSubscribersTopics topics; a topic is warned of again once its interval
// ran out.
func TestNoSubscribersWarnsBounded(t *testing.T) {
	var n noSubscribers
	now := time.Now()
	for i := range noSubscribersTopics {
		require.True(t, n.due("t/"+strconv.Itoa(i), now))
	}
	require.False(t, n.due("t/0", now.Add(time.Second)), "warned already")
	require.False(t, n.due("t/new", now.Add(time.Second)), "full: no room for a new topic")
	require.Len(t, n.warned, noSubscribersTopics)
	later := now.Add(noSubscribersWarnEvery)
	require.True(t, n.due("t/new", later), "the old ones ran out")
	require.Len(t, n.warned, 1)
	require.True(t, n.due("t/new", later.Add(noSubscribersWarnEvery)), "again after an interval")
}
