package mqtt

import (
	"bytes"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/eclipse/paho.golang/packets"
)

// FuzzPublish5 holds the MQTT 5 PUBLISH the connection writes to what
// paho.golang's packets writes for the same message, and the PUBACK the
// reader decodes itself to what packets decodes.
func FuzzPublish5(f *testing.F) {
	f.Add("pos/1/orders", []byte(`{"n":1}`), "application/json", "specversion", "1.0", uint32(0), uint16(1), []byte{0, 1, 0})
	f.Add("a", []byte{}, "", "", "", uint32(90), uint16(65535), []byte{0xff, 0xff, 0x87})
	f.Fuzz(func(t *testing.T, topic string, payload []byte, contentType, key, value string, expiry uint32, id uint16, ack []byte) {
		if len(topic) > 65535 || len(contentType) > 65535 || len(key) > 65535 || len(value) > 65535 {
			return
		}
		p := Properties{ContentType: contentType, MessageExpiry: time.Duration(expiry) * time.Second}
		if key != "" || value != "" {
			p.User = []UserProperty{{key, value}, {value, key}}
		}
		got := appendPublish5(nil, topic, id, payload, &p)
		cp := packets.NewControlPacket(packets.PUBLISH)
		pb := cp.Content.(*packets.Publish)
		pb.QoS, pb.Topic, pb.Payload, pb.PacketID = 1, topic, payload, id
		pb.Properties = pahoProperties(&p)
		var want bytes.Buffer
		if _, err := cp.WriteTo(&want); err != nil {
			t.Skip()
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("appendPublish5 wrote %x, packets %x", got, want.Bytes())
		}
		if rem := RemainingLength(topic, len(payload), &p, true); len(got) != 1+varintSize(rem)+rem {
			t.Fatalf("RemainingLength says %d, the packet is %d bytes", rem, len(got))
		}

		// A PUBACK the reader decodes itself, as packets decodes it.
		in, err := decodeInbound(false, packets.PUBACK<<4, ack)
		if err != nil {
			return
		}
		back, err := decodeFrame(packets.PUBACK<<4, ack)
		if err != nil {
			t.Fatalf("the reader took PUBACK body %x, packets refused it: %v", ack, err)
		}
		pa := back.Content.(*packets.Puback)
		reason := ""
		if pa.Properties != nil {
			reason = pa.Properties.ReasonString
		}
		if pa.PacketID != in.id || pa.ReasonCode != in.code || (utf8.ValidString(reason) && len(reason) <= 256 && reason != in.reason) {
			t.Fatalf("PUBACK %x: id %d code %d reason %q, packets says id %d code %d reason %q", ack, in.id, in.code, in.reason, pa.PacketID, pa.ReasonCode, reason)
		}
	})
}
