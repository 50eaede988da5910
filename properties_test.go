package outbox

import (
	"context"
	"sync"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// publishSeen is a mochi hook that keeps every PUBLISH it is given.
type publishSeen struct {
	mochi.HookBase
	mu   sync.Mutex
	seen []packets.Packet
}

func (h *publishSeen) ID() string           { return "publish-seen" }
func (h *publishSeen) Provides(b byte) bool { return b == mochi.OnPublish }
func (h *publishSeen) OnPublish(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	h.mu.Lock()
	h.seen = append(h.seen, pk.Copy(false))
	h.mu.Unlock()
	return pk, nil
}

func (h *publishSeen) all() []packets.Packet {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]packets.Packet(nil), h.seen...)
}

// TestMQTTPublishProperties: on a connection that speaks 5, the content
// type, the user properties (in order, a key repeated) and the message
// expiry (rounded up to whole seconds) reach the broker; on one that speaks
// 3.1.1 the publisher says it carries none, and a publish still goes.
func TestMQTTPublishProperties(t *testing.T) {
	h := &publishSeen{}
	m := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(auth.AllowHook), h}})
	url := "tcp://" + m.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	props := PublishProperties{
		ContentType:   "application/json",
		User:          []UserProperty{{"ce_id", "a"}, {"ce_type", "t"}, {"ce_id", "b"}},
		MessageExpiry: 1200 * time.Millisecond,
	}

	pub5 := testPublisher(t, url, Protocol5)
	require.NoError(t, pub5.Connect(ctx))
	require.True(t, pub5.CarriesProperties())
	tok := pub5.PublishWithProperties("p/5", []byte("x"), props)
	<-tok.Done()
	require.NoError(t, tok.Error())
	tok = pub5.Publish("p/5/none", []byte("y"))
	<-tok.Done()
	require.NoError(t, tok.Error())

	pub3 := testPublisher(t, url, Protocol311)
	require.NoError(t, pub3.Connect(ctx))
	require.False(t, pub3.CarriesProperties())
	tok = pub3.PublishWithProperties("p/3", []byte("z"), props)
	<-tok.Done()
	require.NoError(t, tok.Error())

	seen := h.all()
	require.Len(t, seen, 3)
	p := seen[0].Properties
	require.Equal(t, "application/json", p.ContentType)
	require.Equal(t, []packets.UserProperty{{Key: "ce_id", Val: "a"}, {Key: "ce_type", Val: "t"}, {Key: "ce_id", Val: "b"}}, p.User)
	require.True(t, p.MessageExpiryInterval == 2, "expiry rounded up to whole seconds: got %d", p.MessageExpiryInterval)
	require.Empty(t, seen[1].Properties.ContentType)
	require.Empty(t, seen[1].Properties.User)
	require.Zero(t, seen[1].Properties.MessageExpiryInterval)
	require.Empty(t, seen[2].Properties.User, "3.1.1 has no properties")
}

// TestRelayPublishesPropertiesOnlyWhereCarried: the relay gives a row's
// properties to a PropertiesPublisher whose connection carries them, and
// Publish otherwise and for a row without any.
func TestRelayPublishesPropertiesOnlyWhereCarried(t *testing.T) {
	for _, carries := range []bool{true, false} {
		pub := &propsPublisher{fakePublisher: &fakePublisher{}, carries: carries}
		require.NoError(t, pub.Connect(context.Background()))
		s := &session{r: &Relay{pub: pub}}
		if carries {
			s.props = pub
		}
		m := &parcel{topic: "t", payload: []byte("w"), props: PublishProperties{ContentType: "text/plain"}}
		<-s.publish(m).Done()
		bare := &parcel{topic: "t", payload: []byte("w")}
		<-s.publish(bare).Done()
		require.Equal(t, 2, pub.publishedCount())
		if carries {
			require.Equal(t, []string{"text/plain"}, pub.got, "a row without properties goes through Publish")
		} else {
			require.Empty(t, pub.got)
		}
	}
}

type propsPublisher struct {
	*fakePublisher
	carries bool
	got     []string // the content type of each PublishWithProperties
}

func (p *propsPublisher) CarriesProperties() bool { return p.carries }
func (p *propsPublisher) PublishWithProperties(topic string, payload []byte, props PublishProperties) Token {
	p.got = append(p.got, props.ContentType)
	return p.fakePublisher.Publish(topic, payload)
}

// TestStructuredModeContentTypeOnMQTT5: the CloudEvents MQTT binding has a
// structured-mode event over MQTT 5 carry the event format's media type as
// its Content Type; over 3.1.1 there is nowhere to put it.
func TestStructuredModeContentTypeOnMQTT5(t *testing.T) {
	forProtocols(t, func(t *testing.T, proto MQTTProtocol) {
		h := &publishSeen{}
		m := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(auth.AllowHook), h}})
		ob := openTest(t, Options{})
		commitOrder(t, ob, "pos/orders", 1)
		startRelay(t, mqttRelayOn(t, ob, "tcp://"+m.Addr(), fastRelay(), proto))
		eventually(t, 10*time.Second, "published", func() bool { return len(h.all()) == 1 })
		want := ""
		if proto == Protocol5 {
			want = "application/cloudevents+json"
		}
		require.Equal(t, want, h.all()[0].Properties.ContentType)
	})
}
