package bench

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// handler receives every message published under bench/ (a subscriber).
type handler func(topic string, payload []byte)

// broker is an MQTT broker on loopback with one subscriber to bench/#.
type broker interface {
	name() string
	url() string
	setHandler(h handler)
	// stop takes the broker away (connections drop, new ones are refused);
	// start brings it back on the same address.
	stop()
	start() error
	close()
}

// mochiBroker is the in-process broker, with an inline subscriber.
type mochiBroker struct {
	b *harness.Mochi
	h atomic.Pointer[handler]
}

func newMochi() (*mochiBroker, error) {
	m := &mochiBroker{}
	b, err := harness.LaunchMochi(harness.MochiOptions{})
	if err != nil {
		return nil, err
	}
	if err := b.Subscribe("bench/#", func(msg harness.Message) { m.deliver(msg.Topic, msg.Payload) }); err != nil {
		b.Close()
		return nil, err
	}
	m.b = b
	return m, nil
}

func (b *mochiBroker) name() string { return "mochi (in-process)" }
func (b *mochiBroker) url() string  { return b.b.URL() }

func (b *mochiBroker) setHandler(h handler) { b.h.Store(&h) }

func (b *mochiBroker) deliver(topic string, payload []byte) {
	if h := b.h.Load(); h != nil && *h != nil {
		(*h)(topic, payload)
	}
}

func (b *mochiBroker) start() error { return b.b.Resume() }
func (b *mochiBroker) stop()        { b.b.Stop() }
func (b *mochiBroker) close()       { b.b.Close() }

// mosquittoBinary is hint if it is a file, or else the mosquitto found in
// PATH or /usr/sbin; "" if absent.
func mosquittoBinary(hint string) string {
	if hint != "" {
		if fi, err := os.Stat(hint); err == nil && fi.Mode().IsRegular() {
			return hint
		}
		return ""
	}
	return harness.MosquittoBinary()
}

func mosquittoVersion(bin string) string { return harness.MosquittoVersion(bin) }

// mosquittoBroker is a Mosquitto of our own (the harness's: its own config
// and port in a temporary directory, started and stopped by PID), with a
// paho subscriber.
type mosquittoBroker struct {
	m *harness.Mosquitto

	mu  sync.Mutex
	sub mqtt.Client
	h   atomic.Pointer[handler]
}

func newMosquitto(bin, dir string) (*mosquittoBroker, error) {
	m, err := harness.LaunchMosquitto(harness.MosquittoOptions{Bin: bin, Dir: dir, Config: []string{
		"allow_anonymous true", "persistence false",
		// No limits that would drop or throttle a QoS 1 subscriber.
		"max_queued_messages 0", "max_inflight_messages 0", "set_tcp_nodelay true",
		// information: the harness waits for the line that says it is
		// running.
		"log_type error", "log_type warning", "log_type notice", "log_type information",
	}})
	if err != nil {
		return nil, err
	}
	b := &mosquittoBroker{m: m}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.subscribeLocked(); err != nil {
		m.Close()
		return nil, err
	}
	return b, nil
}

func (b *mosquittoBroker) name() string { return "mosquitto " + b.m.Version() }
func (b *mosquittoBroker) url() string  { return b.m.URL() }

func (b *mosquittoBroker) setHandler(h handler) { b.h.Store(&h) }

func (b *mosquittoBroker) start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.m.Start(); err != nil {
		return err
	}
	if err := b.subscribeLocked(); err != nil {
		b.m.Stop()
		return err
	}
	return nil
}

// subscribeLocked connects the subscriber: QoS 1, a clean session, handler
// calls in order.
func (b *mosquittoBroker) subscribeLocked() error {
	o := mqtt.NewClientOptions().AddBroker(b.url()).SetClientID("bench-sub-" + strconv.Itoa(os.Getpid())).
		SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(true)
	sub := mqtt.NewClient(o)
	if tok := sub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return fmt.Errorf("subscriber connect: %v", tok.Error())
	}
	tok := sub.Subscribe("bench/#", 1, func(_ mqtt.Client, msg mqtt.Message) {
		if h := b.h.Load(); h != nil && *h != nil {
			(*h)(msg.Topic(), msg.Payload())
		}
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		sub.Disconnect(0)
		return fmt.Errorf("subscribe: %v", tok.Error())
	}
	b.sub = sub
	return nil
}

func (b *mosquittoBroker) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sub != nil {
		b.sub.Disconnect(0)
		b.sub = nil
	}
	b.m.Stop()
}

func (b *mosquittoBroker) close() { b.stop() }
