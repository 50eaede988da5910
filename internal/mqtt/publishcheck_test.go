package mqtt

import (
	"errors"
	"testing"

	"github.com/eclipse/paho.golang/packets"
	"github.com/stretchr/testify/require"
)

// TestPublishCheck: the MQTT 5 subscriber's reader refuses a PUBLISH whose
// properties paho would take wrongly (a property given twice: paho keeps
// the last; a block that runs past the packet: paho reads what is there)
// before paho has it whole, and lets the rest through unchanged, whatever
// the sizes of the reads.
func TestPublishCheck(t *testing.T) {
	publish := func(props ...byte) []byte {
		body := append([]byte{0, 1, 'c', 0, 7}, appendVarint(nil, len(props))...)
		body = append(body, props...) // no payload: the properties end the packet
		return append(append([]byte{0x32}, appendVarint(nil, len(body))...), body...)
	}
	for _, c := range []struct {
		name   string
		stream []byte
		bad    string // what the refusal says; "" to pass
	}{
		{"request properties", publish(0x08, 0, 1, 'r', 0x09, 0, 2, 0xAB, 0xCD, 0x02, 0, 0, 0, 5), ""},
		{"user properties and subscription ids repeat", publish(0x26, 0, 1, 'k', 0, 1, 'v', 0x26, 0, 1, 'k', 0, 1, 'w', 0x0B, 1, 0x0B, 2), ""},
		{"response topic twice", publish(0x08, 0, 1, 'r', 0x08, 0, 1, 's'), "property 0x08 given twice"},
		{"correlation data twice", publish(0x09, 0, 1, 1, 0x09, 0, 1, 2), "property 0x09 given twice"},
		{"message expiry twice", publish(0x02, 0, 0, 0, 5, 0x02, 0, 0, 0, 9), "property 0x02 given twice"},
		{"correlation data past its block", publish(0x09, 0, 9, 1), "property 0x09: truncated"},
		{"a property a PUBLISH may not carry", publish(0x1F, 0, 1, 'x'), "property 0x1F, which this packet may not carry"},
		{"properties past the packet", []byte{0x32, 8, 0, 1, 'c', 0, 7, 10, 0x09, 0, 8}, "run past its end"},
		{"after a CONNACK and a SUBACK", append([]byte{0x20, 3, 0, 0, 0, 0x90, 4, 0, 1, 0, 1}, publish(0x02, 0, 0, 0, 1, 0x02, 0, 0, 0, 1)...), "given twice"},
	} {
		for _, step := range []int{1, 3, 1 << 20} {
			fb := &firstBytes{Conn: readOnlyConn{&pieces{data: c.stream, step: step}}}
			var last *packets.ControlPacket
			var err error
			for {
				cp, rerr := packets.ReadPacket(fb)
				if rerr != nil {
					err = rerr
					break
				}
				last = cp
			}
			var pe *ProtocolError
			if c.bad == "" {
				require.False(t, errors.As(err, &pe), "%s (reads of %d): %v", c.name, step, err)
				require.IsType(t, &packets.Publish{}, last.Content, c.name)
				continue
			}
			require.ErrorAs(t, err, &pe, "%s (reads of %d)", c.name, step)
			require.ErrorContains(t, err, c.bad, c.name)
			if last != nil {
				require.NotEqual(t, byte(packets.PUBLISH), last.Type, "%s: paho had the PUBLISH", c.name)
			}
		}
	}
}
