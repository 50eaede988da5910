package outbox

import (
	"bytes"
	"strings"
	"testing"

	packets311 "github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/stretchr/testify/require"
)

// TestPublish311Encoding: the 3.1.1 PUBLISH the connection writes is the
// packet paho.mqtt.golang's packets package writes and reads, at every
// width of the Remaining Length.
func TestPublish311Encoding(t *testing.T) {
	for _, n := range []int{0, 1, 200, 127 - 2 - 7 - 2, 128 - 2 - 7 - 2, 16383 - 11, 16384 - 11, 2097151 - 11, 2097152 - 11} {
		topic := "a/topic"
		payload := bytes.Repeat([]byte{'x'}, n)
		got := appendPublish311(nil, topic, 4242, payload)

		want := packets311.NewControlPacket(packets311.Publish).(*packets311.PublishPacket)
		want.Qos, want.TopicName, want.MessageID, want.Payload = 1, topic, 4242, payload
		var b bytes.Buffer
		require.NoError(t, want.Write(&b))
		require.Equal(t, b.Bytes(), got, "payload of %d bytes", n)

		cp, err := packets311.ReadPacket(bytes.NewReader(got))
		require.NoError(t, err)
		p := cp.(*packets311.PublishPacket)
		require.Equal(t, topic, p.TopicName)
		require.EqualValues(t, 4242, p.MessageID)
		require.EqualValues(t, 1, p.Qos)
		require.Equal(t, n, len(p.Payload))
	}
	require.Equal(t, []byte{0x32, 5, 0, 1, 'a', 0, 1}, appendPublish311(nil, "a", 1, nil))
	require.True(t, strings.HasPrefix(string(appendPublish311([]byte("keep"), "a", 1, nil)), "keep\x32"))
}
