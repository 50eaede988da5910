package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestCorrelationDataCarried: a message's CorrelationData reaches the
// broker as MQTT 5's Correlation Data in every envelope mode, and, in both
// CloudEvents modes, as the extension correlationdata, which a 3.1.1
// subscriber decodes; a message without it carries neither.
func TestCorrelationDataCarried(t *testing.T) {
	corr := []byte{0, 1, 0xfe, 'r', 'e', 'q'}
	forProtocols(t, func(t *testing.T, proto MQTTProtocol) {
		for _, mode := range []Envelope{EnvelopeCloudEvents, EnvelopeCloudEventsBinary, EnvelopeRaw} {
			t.Run(mode.String(), func(t *testing.T) {
				h := &publishSeen{}
				m := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(auth.AllowHook), h}})
				ob := openTest(t, Options{})
				require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
					return ob.Enqueue(context.Background(), tx,
						Message{Topic: "pos/answers", Payload: []byte(`{"a":1}`), Priority: MaxPriority, CorrelationData: corr},
						Message{Topic: "pos/answers", Payload: []byte(`{"a":2}`)})
				}))
				opts := fastRelay()
				opts.Envelope = mode
				startRelay(t, mqttRelayOn(t, ob, "tcp://"+m.Addr(), opts, proto))
				eventually(t, 10*time.Second, "published", func() bool { return len(h.all()) == 2 })
				seen := h.all()
				if proto == Protocol5 {
					require.Equal(t, corr, seen[0].Properties.CorrelationData)
				} else {
					require.Empty(t, seen[0].Properties.CorrelationData, "3.1.1 has no properties")
				}
				require.Empty(t, seen[1].Properties.CorrelationData)
				if mode == EnvelopeRaw {
					require.Equal(t, `{"a":1}`, string(seen[0].Payload))
					return
				}
				decode := func(pk packets.Packet) Event {
					var user []UserProperty
					for _, u := range pk.Properties.User {
						user = append(user, UserProperty{u.Key, u.Val})
					}
					ev, err := DecodeEventMQTT(pk.Payload, pk.Properties.ContentType, user)
					require.NoError(t, err)
					return ev
				}
				ev := decode(seen[0])
				require.Equal(t, corr, ev.CorrelationData)
				require.Equal(t, `{"a":1}`, string(ev.Data))
				require.Nil(t, decode(seen[1]).CorrelationData)
				require.Equal(t, !bytes.Contains(seen[0].Payload, []byte(`"correlationdata":"`+base64.StdEncoding.EncodeToString(corr)+`"`)),
					mode == EnvelopeCloudEventsBinary && proto == Protocol5, "the extension in structured mode's JSON")
			})
		}
	})
}

// TestCorrelationDataBounds: over 65,535 bytes (MQTT's binary data) is
// refused by Enqueue, and a plain-SQL row's is parked dead, not sent; the
// decoder refuses an extension that is not base64 or decodes longer.
func TestCorrelationDataBounds(t *testing.T) {
	ob := openTest(t, Options{})
	err := ob.Transact(context.Background(), func(tx *sql.Tx) error {
		return ob.Enqueue(context.Background(), tx, Message{Topic: "t", CorrelationData: make([]byte, 65536)})
	})
	require.ErrorIs(t, err, ErrInvalidMessage)
	require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
		return ob.Enqueue(context.Background(), tx, Message{Topic: "t", CorrelationData: make([]byte, 65535)})
	}))

	m := &row{outgoing: outgoing{id: "x", topic: "t", payload: []byte("p"), correlation: make([]byte, 65536)}}
	enc := encoder{mode: EnvelopeCloudEvents, source: "s", defaultType: DefaultEventType}
	enc.encodeRow(m, true)
	require.True(t, errors.Is(m.encErr, ErrInvalidMessage) && errors.Is(m.encErr, ErrUndeliverable), "%v", m.encErr)

	for _, bad := range []string{"not base64!", base64.StdEncoding.EncodeToString(make([]byte, 65536))} {
		_, err := DecodeEvent([]byte(`{"specversion":"1.0","id":"i","source":"s","type":"t","correlationdata":"` + bad + `"}`))
		require.ErrorContains(t, err, "correlationdata")
		_, err = DecodeEventMQTT(nil, "", []UserProperty{{"specversion", "1.0"}, {"id", "i"}, {"source", "s"}, {"type", "t"}, {"correlationdata", bad}})
		require.ErrorContains(t, err, "correlationdata")
	}
}
