package outbox

import (
	"context"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// refuseAll refuses every connection as bad credentials would.
type refuseAll struct{ mochi.HookBase }

func (h *refuseAll) ID() string                                               { return "refuse" }
func (h *refuseAll) Provides(b byte) bool                                     { return b == mochi.OnConnectAuthenticate }
func (h *refuseAll) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return false }

func TestRefusedCredentialsAreNotAnOutageOfMessages(t *testing.T) {
	forProtocols(t, testRefusedCredentialsAreNotAnOutageOfMessages)
}

func testRefusedCredentialsAreNotAnOutageOfMessages(t *testing.T, proto MQTTProtocol) {
	b := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(refuseAll)}})

	ob := openTest(t, Options{})
	commitOrder(t, ob, "t", 1)
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: b.URL(), Username: "till", Password: "hunter2-secret", Protocol: proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	opts := fastRelay()
	opts.Reconnect = Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	var last string
	eventually(t, 5*time.Second, "refusal reported", func() bool {
		s, _ := r.Stats(context.Background())
		last = s.LastError
		return s.LastError != ""
	})
	require.Regexp(t, `the broker refused (the user name or password \(CONNACK (4|0x86)\)|this client: not authori[sz]ed \(CONNACK (5|0x87)\))`, last)
	require.NotContains(t, last, "hunter2")
	state, attempts := rowState(t, ob, 1)
	require.Equal(t, "pending", state)
	require.Zero(t, attempts, "refused credentials never count against a message")
}
