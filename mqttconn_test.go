package outbox

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
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
	for _, p := range []PublishProperties{
		{},
		{ContentType: "application/json"},
		{MessageExpiry: 1500 * time.Millisecond},
		{ContentType: "text/plain", User: []UserProperty{{"specversion", "1.0"}, {"id", long}, {"", ""}, {"id", "again"}}, MessageExpiry: 90 * time.Second},
		{User: []UserProperty{{"k", "v"}}},
	} {
		for _, n := range []int{0, 1, 200, 100, 127, 128, 16383 - 40, 16384, 2097151 - 400, 2097152} {
			topic := "a/topic"
			payload := bytes.Repeat([]byte{'x'}, n)
			got := appendPublish5(nil, topic, 4242, payload, &p)

			cp := packets.NewControlPacket(packets.PUBLISH)
			pb := cp.Content.(*packets.Publish)
			pb.QoS, pb.Topic, pb.Payload, pb.PacketID = 1, topic, payload, 4242
			pb.Properties = wireProperties(&p)
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
		}
	}
	// Without properties: a zero property length, as paho writes it.
	require.Equal(t, []byte{0x32, 6, 0, 1, 'a', 0, 1, 0}, appendPublish5(nil, "a", 1, nil, nil))
	require.True(t, strings.HasPrefix(string(appendPublish5([]byte("keep"), "a", 1, nil, nil)), "keep\x32"))
}

// wireProperties converts p to paho.golang's properties, the reference
// that appendPublish5 and remainingLength are checked against; nil for none.
func wireProperties(p *PublishProperties) *packets.Properties {
	if p.empty() {
		return nil
	}
	wp := &packets.Properties{ContentType: p.ContentType}
	for _, u := range p.User {
		wp.User = append(wp.User, packets.User{Key: u.Key, Value: u.Value})
	}
	if p.MessageExpiry > 0 {
		s := mqttSecondsUp(p.MessageExpiry)
		wp.MessageExpiry = &s
	}
	return wp
}

// countingConn counts the writes made on it.
type countingConn struct {
	net.Conn
	writes atomic.Int32
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// TestConnCoalescesAndReadsAcks: publishes handed over before the writer
// gets to them leave in one write, in order, each under its own packet id;
// PUBACKs that arrive in one piece complete their tokens, a success of
// either version and a refusal with or without properties.
func TestConnCoalescesAndReadsAcks(t *testing.T) {
	client, broker := net.Pipe()
	defer broker.Close()
	cc := &countingConn{Conn: client}
	link := newLinkConn(cc, time.Second)
	p := &MQTTPublisher{opts: MQTTOptions{Logger: slog.New(slog.DiscardHandler)}}
	c := p.newConn(link, link, false)
	const n = 10
	var toks []Token
	for i := 0; i < n; i++ {
		toks = append(toks, c.publish("a/b", []byte{byte(i)}, &PublishProperties{ContentType: "x"}))
	}
	c.start()
	for i := 0; i < n; i++ {
		first, body, err := readFrame(broker, nil)
		require.NoError(t, err)
		cp, err := decodeFrame(first, body)
		require.NoError(t, err)
		pb := cp.Content.(*packets.Publish)
		require.EqualValues(t, i+1, pb.PacketID)
		require.Equal(t, []byte{byte(i)}, pb.Payload)
		require.Equal(t, "x", pb.Properties.ContentType)
	}
	require.EqualValues(t, 1, cc.writes.Load(), "ten publishes handed over together, one write")
	// Each packet's end on the link is its own, not the write's.
	var end int64
	for i, tok := range toks {
		end += int64(len(appendPublish5(nil, "a/b", uint16(i+1), []byte{byte(i)}, &PublishProperties{ContentType: "x"})))
		pt := tok.(*pubToken)
		eventually(t, 10*time.Second, "the write's ends recorded", func() bool { return pt.end.Load() != 0 })
		require.Equal(t, end, pt.end.Load(), "packet %d", i+1)
	}

	var acks []byte
	acks = append(acks, 0x40, 2, 0, 1)    // 3.1.1, or MQTT 5 success without a reason code
	acks = append(acks, 0x40, 3, 0, 2, 0) // MQTT 5, success
	acks = append(acks, 0x40, 3, 0, 3, 0x87)
	refused := packets.NewControlPacket(packets.PUBACK)
	pa := refused.Content.(*packets.Puback)
	pa.PacketID, pa.ReasonCode = 4, 0x80
	pa.Properties = &packets.Properties{ReasonString: "quota spent"}
	var b bytes.Buffer
	_, err := refused.WriteTo(&b)
	require.NoError(t, err)
	acks = append(acks, b.Bytes()...)
	for id := 5; id <= n; id++ {
		acks = append(acks, 0x40, 2, 0, byte(id))
	}
	_, err = broker.Write(acks)
	require.NoError(t, err)
	for i, tok := range toks {
		select {
		case <-tok.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("token %d not completed", i+1)
		}
		switch i + 1 {
		case 3:
			require.ErrorContains(t, tok.Error(), "0x87")
		case 4:
			require.ErrorContains(t, tok.Error(), "quota spent")
		default:
			require.NoError(t, tok.Error(), "token %d", i+1)
		}
	}
	broker.Close()
	p.wg.Wait()
}
