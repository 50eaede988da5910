// Command consumer is the backend side of the outbox: an MQTT subscriber
// that receives the events relayed from the tills, drops redeliveries and
// survives garbage.
//
// Delivery from the outbox is at least once, so the consumer recognises an
// event it has already applied by the pair (source, id) — the CloudEvents
// identity — and skips it. A message that is not a CloudEvents document is
// counted as malformed and skipped; it never stops the consumer.
//
// Events arrive in commit order while the connection holds, but a broker
// may resend a stored session's messages in another order (mochi, the
// embedded broker used here, does). The "seq" printed for each event is
// the commit order within its source: a consumer that needs order sorts or
// checks by it, not by arrival.
//
//	go run ./examples/consumer --demo --count 3
//	go run ./examples/consumer --broker tcp://127.0.0.1:1883 --topic 'stores/#'
//
// With --demo it starts an embedded broker and publishes a few events to it
// itself (one of them twice, plus one message that is not JSON), so it runs
// standalone. It prints one line per message and, on exit (after --count
// unique events, or on SIGINT/SIGTERM), a summary:
//
//	applied 3, duplicates 1, malformed 1
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/edgeoutbox/outbox"
)

type config struct {
	broker   string
	topic    string
	clientID string
	count    int
	demo     bool
}

func main() {
	var cfg config
	flag.StringVar(&cfg.broker, "broker", "", "MQTT broker URL, e.g. tcp://127.0.0.1:1883 (required unless --demo)")
	flag.StringVar(&cfg.topic, "topic", "stores/#", "MQTT topic filter to subscribe to")
	flag.StringVar(&cfg.clientID, "client-id", "consumer-1", "MQTT client id; keep it fixed so the broker keeps this consumer's session")
	flag.IntVar(&cfg.count, "count", 0, "exit after this many unique events (0 = run until SIGINT/SIGTERM)")
	flag.BoolVar(&cfg.demo, "demo", false, "start an embedded broker and publish a few demo events to it")
	flag.Parse()
	if flag.NArg() > 0 || cfg.count < 0 || cfg.topic == "" || cfg.clientID == "" ||
		(cfg.broker == "") == !cfg.demo {
		fmt.Fprintln(os.Stderr, "consumer: give either --broker URL or --demo")
		flag.Usage()
		os.Exit(2)
	}
	if cfg.demo && cfg.count > len(demoEvents) {
		fmt.Fprintf(os.Stderr, "consumer: --demo publishes %d unique events; --count %d would never be reached\n", len(demoEvents), cfg.count)
		os.Exit(2)
	}

	// SIGINT or SIGTERM ends the run cleanly, with the summary.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	var srv *mochi.Server
	if cfg.demo {
		var addr string
		var err error
		srv, addr, err = startBroker()
		if err != nil {
			return fmt.Errorf("embedded broker: %w", err)
		}
		defer srv.Close()
		cfg.broker = "tcp://" + addr
	}
	if _, err := outbox.ParseBrokerURL(cfg.broker); err != nil {
		return err
	}

	c := newConsumer(cfg.count)
	subscribed := make(chan struct{}, 1)

	opts := mqtt.NewClientOptions().
		AddBroker(cfg.broker).
		SetProtocolVersion(4). // MQTT 3.1.1
		// A fixed client id with CleanSession false makes the broker keep
		// this consumer's session — its subscription and the QoS 1 messages
		// published while it is away — and deliver those messages when it
		// connects again. Events are not lost while the backend restarts.
		SetClientID(cfg.clientID).
		SetCleanSession(false).
		// Messages of the stored session arrive right after CONNACK, before
		// any Subscribe call of this process could register a per-topic
		// callback; paho hands such messages to the default handler only
		// (and drops them if there is none). So everything goes through the
		// default handler and Subscribe below passes no callback.
		SetDefaultPublishHandler(c.handle).
		// A message is acknowledged (PUBACK) only after it was handled;
		// see consumer.handle.
		SetAutoAckDisabled(true).
		SetOrderMatters(true). // one message at a time, in arrival order
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(time.Second).
		SetMaxReconnectInterval(10 * time.Second).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			fmt.Fprintln(os.Stderr, "consumer: connection lost, reconnecting:", err)
		}).
		// (Re)subscribe on every connection: the broker may have lost the
		// session (a restart without persistence). Subscribing again to the
		// same filter is harmless. This runs in its own goroutine, so it
		// may wait for the token.
		SetOnConnectHandler(func(client mqtt.Client) {
			tok := client.Subscribe(cfg.topic, 1, nil)
			tok.Wait()
			if err := tok.Error(); err != nil {
				fmt.Fprintln(os.Stderr, "consumer: subscribe:", err)
				return
			}
			select {
			case subscribed <- struct{}{}:
			default:
			}
		})

	client := mqtt.NewClient(opts)
	fmt.Fprintf(os.Stderr, "consumer: connecting to %s as %s\n", cfg.broker, cfg.clientID)
	// With ConnectRetry the token completes only once connected, so a
	// broker that is not up yet is waited for; SIGINT still ends the wait.
	tok := client.Connect()
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return fmt.Errorf("connect to %s: %w", cfg.broker, err)
		}
	case <-ctx.Done():
		client.Disconnect(0)
		c.summary()
		return nil
	}
	defer client.Disconnect(250)

	select {
	case <-subscribed:
		fmt.Printf("subscribed to %s at %s as %s\n", cfg.topic, cfg.broker, cfg.clientID)
	case <-ctx.Done():
		c.summary()
		return nil
	}

	if cfg.demo {
		if err := publishDemo(srv); err != nil {
			return err
		}
	}

	select {
	case <-c.done: // --count unique events applied
	case <-ctx.Done(): // SIGINT or SIGTERM
	}
	c.summary()
	return nil
}

// key identifies an event: CloudEvents ids are unique per source.
type key struct{ source, id string }

// consumer applies each event once.
type consumer struct {
	mu   sync.Mutex
	seen map[key]bool
	// This in-memory set is only for the example. A real consumer keeps
	// it in its own database — an inbox table keyed by (source, id) —
	// and inserts into it in the SAME transaction as the event's effects,
	// so an event is applied once even across crashes and restarts.
	applied, duplicates, malformed int

	count    int // stop after this many applied events; 0 = never
	done     chan struct{}
	finished bool
}

func newConsumer(count int) *consumer {
	return &consumer{seen: map[key]bool{}, count: count, done: make(chan struct{})}
}

// handle processes one message and then acknowledges it. paho calls it for
// one message at a time.
func (c *consumer) handle(_ mqtt.Client, msg mqtt.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.finished {
		// --count was reached and the consumer is shutting down. Not
		// acknowledging leaves the message with the broker's session, to
		// be delivered again when this consumer returns.
		return
	}
	defer msg.Ack() // after the effects: a crash before this means a redelivery, never a loss

	ev, err := outbox.DecodeEvent(msg.Payload())
	if err != nil {
		// Not an event: count it, say so and move on. Acknowledging it
		// is deliberate — it would never decode on a redelivery either.
		c.malformed++
		fmt.Printf("malformed topic=%s bytes=%d error=%q\n", msg.Topic(), len(msg.Payload()), err)
		return
	}
	k := key{ev.Source, ev.ID}
	if c.seen[k] {
		c.duplicates++
		fmt.Printf("duplicate source=%s id=%s seq=%d type=%s\n", ev.Source, ev.ID, ev.Sequence, ev.Type)
		return
	}

	// Apply the event here (update a read model, call a service, ...).
	// With an inbox, this and the insert of k share one transaction.
	c.seen[k] = true
	c.applied++
	fmt.Printf("applied source=%s id=%s seq=%d type=%s\n", ev.Source, ev.ID, ev.Sequence, ev.Type)

	if c.count > 0 && c.applied == c.count {
		c.finished = true
		close(c.done)
	}
}

func (c *consumer) summary() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.finished = true // no more messages are handled (or acknowledged)
	fmt.Printf("applied %d, duplicates %d, malformed %d\n", c.applied, c.duplicates, c.malformed)
}

// startBroker starts an embedded MQTT broker on a free loopback port. The
// inline client lets this program publish the demo events into it.
func startBroker() (*mochi.Server, string, error) {
	srv := mochi.New(&mochi.Options{
		InlineClient: true,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return nil, "", err
	}
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: "127.0.0.1:0"})
	if err := srv.AddListener(tcp); err != nil {
		return nil, "", err
	}
	if err := srv.Serve(); err != nil {
		srv.Close()
		return nil, "", err
	}
	return srv, tcp.Address(), nil
}

// cloudEvent is the structured-mode CloudEvents JSON document that the
// outbox relay publishes (see the README, "On the wire").
type cloudEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Time            time.Time       `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Sequence        string          `json:"sequence"` // zero-padded to 20 digits
	Data            json.RawMessage `json:"data"`
}

// demoEvents are what --demo publishes, as two tills' relays would. The
// third has the same id as the first but another source: a different event.
var demoEvents = func() []cloudEvent {
	id1, id2 := outbox.NewID(), outbox.NewID()
	now := time.Now().UTC()
	ev := func(source, id string, seq int, typ, data string) cloudEvent {
		return cloudEvent{
			SpecVersion: "1.0", ID: id, Source: source, Type: typ, Time: now,
			DataContentType: "application/json", Sequence: fmt.Sprintf("%020d", seq), Data: json.RawMessage(data),
		}
	}
	return []cloudEvent{
		ev("/stores/1/tills/1", id1, 1, "com.example.pos.OrderPlaced", `{"order":1,"amount_cents":1250}`),
		ev("/stores/1/tills/1", id2, 2, "com.example.pos.PaymentCaptured", `{"payment":1,"order":1,"amount_cents":1250}`),
		ev("/stores/1/tills/2", id1, 1, "com.example.pos.OrderPlaced", `{"order":1,"amount_cents":990}`),
	}
}()

// publishDemo publishes the demo events through the broker's inline client:
// the first, the second, the first AGAIN (as after a relay's reconnect), a
// message that is not JSON, then the third. Each --demo run expects
// "applied 3, duplicates 1, malformed 1" with --count 3 (the third applied
// event is the last message).
func publishDemo(srv *mochi.Server) error {
	docs := make([][]byte, len(demoEvents))
	for i, ev := range demoEvents {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		docs[i] = b
	}
	msgs := []struct {
		topic   string
		payload []byte
	}{
		{"stores/1/orders", docs[0]},
		{"stores/1/payments", docs[1]},
		{"stores/1/orders", docs[0]}, // a redelivery: same source and id
		{"stores/1/orders", []byte("not json at all")},
		{"stores/1/orders", docs[2]},
	}
	for _, m := range msgs {
		if err := srv.Publish(m.topic, m.payload, false, 1); err != nil {
			return errors.Join(fmt.Errorf("publish demo message to %s", m.topic), err)
		}
	}
	return nil
}
