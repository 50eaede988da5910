package harness

import (
	"crypto/tls"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// SubscriberOptions shape a Subscriber.
type SubscriberOptions struct {
	ClientID string
	Filter   string // subscribed at QoS 1
	// Username and Password, if set, are sent at CONNECT.
	Username, Password string
	// TLS, if set, connects with ssl:// and this configuration.
	TLS *tls.Config
	// OnMessage, if set, is called with every message's payload too, one
	// at a time, in arrival order, after the log has it.
	OnMessage func(payload []byte)
}

// Subscriber is a paho client with a fixed client id and CleanSession
// false, subscribed at QoS 1, so the broker queues what it misses while
// disconnected; what it receives goes to Log. Once running, it reconnects
// by itself (not with paho's auto-reconnect, so that it can check the
// CONNACK's session-present flag: a lost session means a lost queue, and
// fails the test).
type Subscriber struct {
	Log *EventLog

	tb     TB
	client mqtt.Client
	filter string

	lost chan struct{}
	stop chan struct{}
	done chan struct{}

	reconnects  atomic.Int64
	sessionLost atomic.Int64
}

// NewSubscriber makes a subscriber to the broker at addr (host:port),
// recording into log; it does not connect.
func NewSubscriber(tb TB, addr string, o SubscriberOptions, log *EventLog) *Subscriber {
	s := &Subscriber{Log: log, tb: tb, filter: o.Filter, lost: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	co := mqtt.NewClientOptions()
	if o.TLS != nil {
		co.AddBroker("ssl://" + addr)
		co.SetTLSConfig(o.TLS)
	} else {
		co.AddBroker("tcp://" + addr)
	}
	co.SetClientID(o.ClientID)
	if o.Username != "" {
		co.SetUsername(o.Username)
		co.SetPassword(o.Password)
	}
	co.SetProtocolVersion(4)
	co.SetCleanSession(false)
	co.SetAutoReconnect(false)
	co.SetConnectRetry(false)
	co.SetConnectTimeout(5 * time.Second)
	co.SetKeepAlive(5 * time.Second)
	co.SetOrderMatters(true) // handled one at a time, in arrival order
	// Messages queued by the session arrive right after CONNACK, before any
	// Subscribe call of ours: the default handler takes them.
	co.SetDefaultPublishHandler(func(_ mqtt.Client, msg mqtt.Message) {
		s.Log.Add(msg.Payload())
		if o.OnMessage != nil {
			o.OnMessage(msg.Payload())
		}
	})
	co.SetConnectionLostHandler(func(mqtt.Client, error) {
		select {
		case s.lost <- struct{}{}:
		default:
		}
	})
	s.client = mqtt.NewClient(co)
	return s
}

// StartSubscriber connects a subscriber to addr (the broker itself, never
// through a proxy), recording with decode, and keeps it connected until tb
// ends.
func StartSubscriber(tb TB, addr string, o SubscriberOptions, decode Decoder) *Subscriber {
	tb.Helper()
	s := NewSubscriber(tb, addr, o, NewEventLog(decode))
	if _, err := s.Connect(); err != nil {
		tb.Fatalf("subscriber: %v", err)
	}
	go s.run()
	tb.Cleanup(s.close)
	return s
}

// Connect connects once and subscribes; it reports whether the broker still
// had the session.
func (s *Subscriber) Connect() (sessionPresent bool, err error) {
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

// Disconnect leaves the broker, waiting up to quiesce milliseconds for
// work in progress; the session stays with the broker.
func (s *Subscriber) Disconnect(quiesce uint) { s.client.Disconnect(quiesce) }

// run keeps the subscriber connected until close.
func (s *Subscriber) run() {
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
			present, err := s.Connect()
			if err == nil {
				s.reconnects.Add(1)
				if !present {
					s.sessionLost.Add(1)
					s.tb.Errorf("subscriber reconnected without its session: the broker lost its queue")
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

func (s *Subscriber) close() {
	close(s.stop)
	<-s.done
	s.client.Disconnect(0)
}

// Reconnects is how many times the running subscriber connected again.
func (s *Subscriber) Reconnects() int64 { return s.reconnects.Load() }

// SessionsLost is how many of those reconnections found its session gone.
func (s *Subscriber) SessionsLost() int64 { return s.sessionLost.Load() }
