package consumer

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// sharedBroker is a broker for TestSharedMemberGoesAway: its address, and
// whether it has seen the connection of a client id end (so that what is
// published next is routed knowing the member is gone).
type sharedBroker struct {
	addr string
	gone func(clientID string) bool
}

// TestSharedMemberGoesAway measures what a broker does with the share of a
// shared-subscription member that goes away without a DISCONNECT (a crash,
// a lost link), and is the evidence for docs/consumer.md's "Shared
// subscriptions: a member that goes away". Two Subscribers, "live" and
// "gone", are members of $share/g/pos/# with one Inbox; gone's connection
// goes through a proxy that is cut and then refuses. With gone away, a
// relay publishes n events; then gone comes back. Every event is applied
// once in the end, and:
//   - persistent sessions (the default): the broker keeps gone's share in
//     its offline session, live gets only its own share, gone gets the rest
//     when it comes back;
//   - CleanSession: gone's session ends with its connection, so live gets
//     all n while gone is away.
//
// Per broker (mochi, Mosquitto), MQTT version and session kind; the figures
// are logged.
func TestSharedMemberGoesAway(t *testing.T) {
	brokers := map[string]func(t *testing.T) sharedBroker{
		"mochi": func(t *testing.T) sharedBroker {
			b := startBroker(t)
			return sharedBroker{addr: b.addr, gone: func(id string) bool {
				cl, ok := b.srv.Clients.Get(id)
				return !ok || cl.Closed()
			}}
		},
		"mosquitto": func(t *testing.T) sharedBroker {
			m := harness.StartMosquitto(t, harness.MosquittoOptions{})
			return sharedBroker{addr: m.Addr(), gone: func(id string) bool {
				log := m.LogSince(0)
				return strings.Contains(log, "Client "+id+" closed its connection") ||
					strings.Contains(log, "Socket error on client "+id)
			}}
		},
	}
	const n = 100
	for _, name := range []string{"mochi", "mosquitto"} {
		t.Run(name, func(t *testing.T) {
			forProtocols(t, func(t *testing.T, proto outbox.MQTTProtocol) {
				for _, clean := range []bool{false, true} {
					kind := "persistent"
					if clean {
						kind = "clean"
					}
					t.Run(kind, func(t *testing.T) {
						t.Parallel() // each case has a broker of its own
						b := brokers[name](t)
						url := "tcp://" + b.addr
						proxy := harness.StartFaultProxy(t, b.addr)
						db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
						in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
						require.NoError(t, err)

						var mu sync.Mutex
						got := map[string][]int64{} // member -> sequences applied
						member := func(id, url string) *Subscriber {
							s, _ := runSubscriber(t, in, recordApplied, SubscriberOptions{
								Broker: url, ClientID: id, Topics: []string{"$share/g/pos/#"}, Protocol: proto, CleanSession: clean,
								OnEvent: func(ev outbox.Event, o Outcome, _ error) {
									if o == Applied {
										mu.Lock()
										got[id] = append(got[id], ev.Sequence)
										mu.Unlock()
									}
								},
							})
							eventually(t, 10*time.Second, id+" subscribed", func() bool { return s.Stats().Connected })
							return s
						}
						count := func(id string) int {
							mu.Lock()
							defer mu.Unlock()
							return len(got[id])
						}
						member("live", url)
						gone := member("gone", proxy.URL())

						// gone's connection ends without a DISCONNECT, and
						// it cannot reconnect while the proxy is down.
						proxy.Down()
						eventually(t, 10*time.Second, "the broker saw gone's connection end", func() bool {
							return !gone.Stats().Connected && b.gone("gone")
						})
						ob := openTest(t, outbox.Options{})
						startRelay(t, mqttRelayOn(t, ob, url, fastRelay(), proto))
						// One transaction: the events reach the broker at once.
						require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
							for i := 0; i < n; i++ {
								if err := ob.Enqueue(context.Background(), tx, outbox.Message{Topic: "pos/orders", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}); err != nil {
									return err
								}
							}
							return nil
						}))
						eventually(t, 20*time.Second, "the relay sent every event", func() bool { return countState(t, ob, "pending") == 0 })
						if clean {
							eventually(t, 20*time.Second, "live applied all", func() bool { return count("live") == n })
						}
						whileAway := count("live")

						require.NoError(t, proxy.Up())
						eventually(t, 20*time.Second, "every event applied", func() bool { return appliedCount(t, db) == n })
						eventually(t, 10*time.Second, "the members' counts add up", func() bool { return count("live")+count("gone") == n })
						mu.Lock()
						all := slices.Concat(got["live"], got["gone"])
						mu.Unlock()
						slices.Sort(all)
						want := make([]int64, n)
						for i := range want {
							want[i] = int64(i + 1)
						}
						require.Equal(t, want, all, "every committed event applied once, between the members")
						t.Logf("%s, MQTT %s, %s session: %d events published while one member was away: %d to the live member, %d held for the one away (applied when it came back)",
							name, proto, kind, n, count("live"), count("gone"))
						if clean {
							require.Equal(t, n, whileAway, "with a clean session the live member gets every event")
							require.Zero(t, count("gone"))
						} else {
							require.Positive(t, count("gone"), "the broker kept the share of the member away")
							require.Less(t, whileAway, n, fmt.Sprint("live got ", whileAway))
						}
					})
				}
			})
		})
	}
}
