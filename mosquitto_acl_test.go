//go:build linux

package outbox

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestMosquittoACLDeniedPublish shows what a fleet's broker ACL does to a
// publish outside the device's prefix. Mosquitto (MQTT 3.1.1) acknowledges
// a QoS 1 publish its ACL denies and drops it: the relay cannot tell it
// from a delivery, so the row is marked sent. FLEET.md and the README say
// so; the defence is at the device (topics built from one prefix) and in
// the broker's log.
func TestMosquittoACLDeniedPublish(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	dir := t.TempDir()
	acl := filepath.Join(dir, "acl")
	// Anonymous clients read everything under fleet/; each client writes
	// only under fleet/<its client id>/.
	require.NoError(t, os.WriteFile(acl, []byte("topic read fleet/#\npattern write fleet/%c/#\n"), 0o600))
	m := harness.StartMosquitto(t, harness.MosquittoOptions{Dir: dir, Config: []string{
		"allow_anonymous true", "acl_file " + acl, "persistence false", "log_type all",
	}})
	addr := m.Addr()

	sub := startPersistentSubscriber(t, addr, "consumer", "fleet/#")
	ob := openTest(t, Options{})
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: "tcp://" + addr, ClientID: "till-1", ConnectTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	startRelay(t, r)

	commitOrder(t, ob, "fleet/till-1/orders", 1)
	commitOrder(t, ob, "fleet/till-2/orders", 2) // another device's prefix
	commitOrder(t, ob, "fleet/till-1/orders", 3)
	eventually(t, 10*time.Second, "all three acknowledged", func() bool { return countState(t, ob, "sent") == 3 })
	eventually(t, 5*time.Second, "the allowed two delivered", func() bool { return sub.Log.Unique() == 2 })
	s, err := r.Stats(t.Context())
	require.NoError(t, err)
	require.True(t, s.Connected, "the connection was not dropped")
	require.Zero(t, countState(t, ob, "dead"))
	// A fence: Mosquitto forwards one connection's messages in order, so
	// once a later one has arrived the denied one is not on its way.
	commitOrder(t, ob, "fleet/till-1/orders", 4)
	eventually(t, 5*time.Second, "the fence delivered", func() bool { return sub.Log.Unique() == 3 })
	var deniedID string
	require.NoError(t, ob.DB().QueryRow(`SELECT id FROM outbox WHERE seq = 2`).Scan(&deniedID))
	require.False(t, sub.Log.Has(deniedID), "the denied publish was dropped")
	require.Contains(t, m.LogSince(0), "Denied PUBLISH from till-1", "the broker's log is where it shows")
}
