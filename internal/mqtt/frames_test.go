package mqtt

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
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

// TestPublish5Encoding: appendPublish5 writes what paho.golang's packets
// writes, byte for byte, with and without each property, at every width of
// the Remaining Length; and packets reads it back.
func TestPublish5Encoding(t *testing.T) {
	long := strings.Repeat("v", 300)
	for _, p := range []Properties{
		{},
		{ContentType: "application/json"},
		{MessageExpiry: 1500 * time.Millisecond},
		{ContentType: "text/plain", User: []UserProperty{{"specversion", "1.0"}, {"id", long}, {"", ""}, {"id", "again"}}, MessageExpiry: 90 * time.Second},
		{User: []UserProperty{{"k", "v"}}},
		{CorrelationData: []byte("req-7")},
		{CorrelationData: []byte{}},
		{ContentType: "application/json", CorrelationData: bytes.Repeat([]byte{0xff}, 65535), User: []UserProperty{{"k", "v"}}, MessageExpiry: time.Second},
	} {
		for _, n := range []int{0, 1, 200, 100, 127, 128, 16383 - 40, 16384, 2097151 - 400, 2097152} {
			topic := "a/topic"
			payload := bytes.Repeat([]byte{'x'}, n)
			got := appendPublish5(nil, topic, 4242, payload, &p)

			cp := packets.NewControlPacket(packets.PUBLISH)
			pb := cp.Content.(*packets.Publish)
			pb.QoS, pb.Topic, pb.Payload, pb.PacketID = 1, topic, payload, 4242
			pb.Properties = pahoProperties(&p)
			var b bytes.Buffer
			_, err := cp.WriteTo(&b)
			require.NoError(t, err)
			require.Equal(t, b.Bytes(), got, "%+v, payload of %d bytes", p, n)

			back, err := packets.ReadPacket(bytes.NewReader(got))
			require.NoError(t, err)
			rp := back.Content.(*packets.Publish)
			require.Equal(t, topic, rp.Topic)
			require.EqualValues(t, 4242, rp.PacketID)
			require.EqualValues(t, 1, rp.QoS)
			require.Equal(t, n, len(rp.Payload))
			require.Equal(t, p.ContentType, rp.Properties.ContentType)
			require.Len(t, rp.Properties.User, len(p.User))
			require.Equal(t, string(p.CorrelationData), string(rp.Properties.CorrelationData))
		}
	}
	// Without properties: a zero property length, as paho writes it.
	require.Equal(t, []byte{0x32, 6, 0, 1, 'a', 0, 1, 0}, appendPublish5(nil, "a", 1, nil, nil))
	require.True(t, strings.HasPrefix(string(appendPublish5([]byte("keep"), "a", 1, nil, nil)), "keep\x32"))
}

// pahoProperties converts p to paho.golang's properties, the reference
// that appendPublish5 and RemainingLength are checked against; nil for none.
func pahoProperties(p *Properties) *packets.Properties {
	if p.ContentType == "" && len(p.User) == 0 && p.MessageExpiry <= 0 && len(p.CorrelationData) == 0 {
		return nil
	}
	wp := &packets.Properties{ContentType: p.ContentType, CorrelationData: p.CorrelationData}
	for _, u := range p.User {
		wp.User = append(wp.User, packets.User{Key: u.Key, Value: u.Value})
	}
	if p.MessageExpiry > 0 {
		s := secondsUp(p.MessageExpiry)
		wp.MessageExpiry = &s
	}
	return wp
}

// TestRemainingLength: the size the relay checks against MQTT's limit is
// the Remaining Length of the PUBLISH as encoded: the packet id counts, and
// on MQTT 5 the properties and their length.
func TestRemainingLength(t *testing.T) {
	long := strings.Repeat("x", 200)
	for _, p := range []Properties{
		{},
		{ContentType: "application/json"},
		{ContentType: "text/plain", User: []UserProperty{{"specversion", "1.0"}, {"id", long}, {"", ""}}},
		{User: []UserProperty{{"k", "v"}}, MessageExpiry: 90 * time.Second},
		{CorrelationData: []byte("req-7"), ContentType: "application/json"},
	} {
		for _, n := range []int{0, 10, 200} {
			payload := bytes.Repeat([]byte{1}, n)
			cp := packets.NewControlPacket(packets.PUBLISH)
			pb := cp.Content.(*packets.Publish)
			pb.QoS, pb.Topic, pb.Payload, pb.PacketID = 1, "pos/1/orders", payload, 7
			pb.Properties = pahoProperties(&p)
			if pb.Properties == nil {
				pb.Properties = &packets.Properties{}
			}
			var buf bytes.Buffer
			_, err := cp.WriteTo(&buf)
			require.NoError(t, err)
			// The fixed header: one byte, then the Remaining Length.
			rem, shift := 0, 0
			for _, c := range buf.Bytes()[1:] {
				rem |= int(c&0x7f) << shift
				shift += 7
				if c&0x80 == 0 {
					break
				}
			}
			require.Equal(t, buf.Len()-1-varintSize(rem), rem)
			require.Equal(t, rem, RemainingLength("pos/1/orders", n, &p, true), "MQTT 5, %+v, payload %d", p, n)
			// 3.1.1: no properties at all.
			require.Equal(t, 2+len("pos/1/orders")+2+n, RemainingLength("pos/1/orders", n, &p, false))
		}
	}
}
