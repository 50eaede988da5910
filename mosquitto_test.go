//go:build linux

package outbox

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// The subscriber of the tests against a real broker, connected to it
// directly.

// eventLog records what a subscriber received: every delivery, the first
// delivery of each event id in order, duplicates and decoding errors.
type eventLog struct {
	mu         sync.Mutex
	deliveries int
	seen       map[string]int64 // id -> sequence
	firstSeqs  []int64
	dups       int
	decodeErrs int
	disorder   []string // first deliveries that broke commit order
	lastFirst  time.Time
}

func newEventLog() *eventLog { return &eventLog{seen: map[string]int64{}} }

func (l *eventLog) add(payload []byte) {
	ev, err := DecodeEvent(payload)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deliveries++
	if err != nil {
		l.decodeErrs++
		return
	}
	if _, ok := l.seen[ev.ID]; ok {
		l.dups++
		return
	}
	l.seen[ev.ID] = ev.Sequence
	if n := len(l.firstSeqs); n > 0 && ev.Sequence <= l.firstSeqs[n-1] && len(l.disorder) < 20 {
		l.disorder = append(l.disorder, fmt.Sprintf("seq %d first delivered after seq %d", ev.Sequence, l.firstSeqs[n-1]))
	}
	l.firstSeqs = append(l.firstSeqs, ev.Sequence)
	l.lastFirst = time.Now()
}

func (l *eventLog) unique() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.firstSeqs)
}

func (l *eventLog) has(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.seen[id]
	return ok
}

// persistentSubscriber is a paho client with a fixed client id and
// CleanSession false, subscribed at QoS 1, so the broker queues what it
// misses while disconnected. It reconnects by itself (not with paho's
// auto-reconnect, so that it can check the CONNACK's session-present flag:
// a lost session means a lost queue).
type persistentSubscriber struct {
	t      testing.TB
	client mqtt.Client
	filter string
	log    *eventLog

	lost chan struct{}
	stop chan struct{}
	done chan struct{}

	reconnects  atomic.Int64
	sessionLost atomic.Int64
}

func newPersistentSubscriber(t testing.TB, addr, clientID, filter string, log *eventLog) *persistentSubscriber {
	s := &persistentSubscriber{t: t, filter: filter, log: log, lost: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	o := mqtt.NewClientOptions()
	o.AddBroker("tcp://" + addr)
	o.SetClientID(clientID)
	o.SetProtocolVersion(4)
	o.SetCleanSession(false)
	o.SetAutoReconnect(false)
	o.SetConnectRetry(false)
	o.SetConnectTimeout(2 * time.Second)
	o.SetKeepAlive(5 * time.Second)
	o.SetOrderMatters(true) // handled one at a time, in arrival order
	// Messages queued by the session arrive right after CONNACK, before any
	// Subscribe call of ours: the default handler takes them.
	o.SetDefaultPublishHandler(func(_ mqtt.Client, msg mqtt.Message) { s.log.add(msg.Payload()) })
	o.SetConnectionLostHandler(func(mqtt.Client, error) {
		select {
		case s.lost <- struct{}{}:
		default:
		}
	})
	s.client = mqtt.NewClient(o)
	return s
}

// connect connects once and subscribes; it reports whether the broker still
// had the session.
func (s *persistentSubscriber) connect() (sessionPresent bool, err error) {
	tok := s.client.Connect()
	tok.Wait()
	if err := tok.Error(); err != nil {
		return false, err
	}
	present := tok.(*mqtt.ConnectToken).SessionPresent()
	if !present {
		st := s.client.Subscribe(s.filter, 1, nil)
		st.Wait()
		if err := st.Error(); err != nil {
			s.client.Disconnect(0)
			return false, err
		}
	}
	return present, nil
}

// run keeps the subscriber connected until close.
func (s *persistentSubscriber) run() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			return
		case <-s.lost:
		}
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			present, err := s.connect()
			if err == nil {
				s.reconnects.Add(1)
				if !present {
					s.sessionLost.Add(1)
					s.t.Errorf("subscriber reconnected without its session: the broker lost its queue")
				}
				break
			}
			select { // retry pacing while the broker is away
			case <-s.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

func (s *persistentSubscriber) close() {
	close(s.stop)
	<-s.done
	s.client.Disconnect(0)
}

// startPersistentSubscriber connects a persistent subscriber to addr (the
// broker itself, never through a proxy) and keeps it connected until the
// test ends.
func startPersistentSubscriber(t testing.TB, addr, clientID, filter string) *persistentSubscriber {
	t.Helper()
	s := newPersistentSubscriber(t, addr, clientID, filter, newEventLog())
	if _, err := s.connect(); err != nil {
		t.Fatalf("subscriber: %v", err)
	}
	go s.run()
	t.Cleanup(s.close)
	return s
}
