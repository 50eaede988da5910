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
// goes through a proxy. First what the broker sends gone is lost on the
// way (its share is in flight, unacknowledged) and its connection is cut;
// then events are published while it is away; then it comes back. Nothing
// is ever applied twice, and:
//   - persistent sessions (the default): nothing is lost; gone's share of
//     both, in flight and published while it was away, waits in its
//     offline session and is applied when it comes back. Its session
//     outlives a clean stop too, keeping its share of what follows, until
//     it is retired (one connection with CleanSession), which discards
//     what the session held;
//   - CleanSession: live gets every event published while gone is away,
//     but what was in flight to gone when its connection broke is lost
//     (not given to live, nor to gone when it returns).
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
	// inFlight events are sent while the member's link loses what reaches
	// it; away are published once it is gone; stopped while it is stopped
	// (persistent sessions only), and retired after it was retired.
	const inFlight, away, stopped, retired = 40, 100, 20, 20
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
						member := func(id, url string, clean bool) (*Subscriber, func()) {
							s, stop := runSubscriber(t, in, recordApplied, SubscriberOptions{
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
							return s, stop
						}
						count := func(id string) int {
							mu.Lock()
							defer mu.Unlock()
							return len(got[id])
						}
						// between counts id's events of sequences [lo, hi].
						between := func(id string, lo, hi int) (k int) {
							mu.Lock()
							defer mu.Unlock()
							for _, seq := range got[id] {
								if seq >= int64(lo) && seq <= int64(hi) {
									k++
								}
							}
							return k
						}
						member("live", url, clean)
						gone, stopGone := member("gone", proxy.URL(), clean)
						ob := openTest(t, outbox.Options{})
						startRelay(t, mqttRelayOn(t, ob, url, fastRelay(), proto))
						publish := func(k int) {
							// One transaction: the events reach the broker at once.
							require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
								for i := 0; i < k; i++ {
									if err := ob.Enqueue(context.Background(), tx, outbox.Message{Topic: "pos/orders", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}); err != nil {
										return err
									}
								}
								return nil
							}))
							eventually(t, 20*time.Second, "the broker acknowledged every event", func() bool { return countState(t, ob, "pending") == 0 })
						}

						// 1. What the broker sends gone is lost on the way:
						// its share of these is in flight, unacknowledged,
						// when its connection ends without a DISCONNECT. It
						// cannot reconnect while the proxy is down.
						proxy.Drop(harness.ToClient)
						publish(inFlight)
						proxy.Down()
						proxy.EndDrop()
						eventually(t, 10*time.Second, "the broker saw gone's connection end", func() bool {
							return !gone.Stats().Connected && b.gone("gone")
						})
						// 2. Published while gone is away.
						publish(away)
						const total = inFlight + away
						if clean {
							// live's connection delivers in order: once it has
							// every event of step 2, whatever of step 1 the
							// broker gave it when gone went away has come too.
							eventually(t, 20*time.Second, "live applied every event published while gone was away", func() bool {
								return between("live", inFlight+1, total) == away
							})
						}

						// 3. gone comes back.
						require.NoError(t, proxy.Up())
						eventually(t, 10*time.Second, "gone back", func() bool { return gone.Stats().Connected })
						if !clean {
							eventually(t, 20*time.Second, "every event applied", func() bool { return appliedCount(t, db) == total })
						}
						// A member counts an event after its transaction
						// committed: the counts may trail the table a moment.
						eventually(t, 10*time.Second, "the members' counts add up", func() bool {
							return count("live")+count("gone") == appliedCount(t, db)
						})
						liveInFlight, liveAway := between("live", 1, inFlight), between("live", inFlight+1, total)
						mu.Lock()
						all := slices.Concat(got["live"], got["gone"])
						mu.Unlock()
						slices.Sort(all)
						require.Equal(t, len(all), len(slices.Compact(slices.Clone(all))), "no event applied twice")
						lost := total - len(all)
						t.Logf("%s, MQTT %s, %s session: of %d events in flight to a member whose connection broke: %d to the live member, %d waited for it (applied when it came back), %d lost; "+
							"of %d published while it was away: %d to the live member, %d waited for it",
							name, proto, kind, inFlight, liveInFlight, between("gone", 1, inFlight), inFlight-liveInFlight-between("gone", 1, inFlight),
							away, liveAway, between("gone", inFlight+1, total))
						if clean {
							require.Equal(t, away, liveAway, "with a clean session the live member gets every event published while the other is away")
							require.Zero(t, count("gone"), "a clean session keeps nothing for the member away")
							require.Positive(t, lost, "the events in flight to the member whose connection broke are lost")
							require.Equal(t, inFlight-liveInFlight, lost)
						} else {
							require.Zero(t, lost, "a persistent session loses nothing")
							require.Positive(t, between("gone", 1, inFlight), "the broker kept the events in flight to the member away")
							require.Positive(t, between("gone", inFlight+1, total), "the broker kept the share of the member away")

							// 4. gone stops as a consumer does (a DISCONNECT):
							// its session, which never expires, keeps its
							// share of what is published next.
							stopGone()
							publish(stopped)
							// 5. gone is retired: one connection with a clean
							// session ends its session, and what it held.
							_, stopRetired := member("gone", url, true)
							stopRetired()
							publish(retired)
							end := total + stopped + retired
							eventually(t, 20*time.Second, "live applied every event published after gone was retired", func() bool {
								return between("live", end-retired+1, end) == retired
							})
							liveStopped := between("live", total+1, total+stopped)
							t.Logf("%s, MQTT %s, %s session: of %d events published while the member was stopped: %d to the live member, %d discarded when it was retired; of %d published after: %d to the live member",
								name, proto, kind, stopped, liveStopped, stopped-liveStopped-between("gone", total+1, total+stopped), retired, between("live", end-retired+1, end))
							require.Zero(t, between("gone", total+1, end), "the retired member's session held nothing more for it")
							require.Positive(t, stopped-liveStopped, "the stopped member's session kept its share, discarded at its retirement")
						}
					})
				}
			})
		})
	}
}
