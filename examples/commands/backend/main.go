// Command backend sends commands to a till as a backend would, over MQTT 5
// request/response, and waits for their answers: each command is a
// CloudEvent (a price change) published at QoS 1 to the till's command
// topic with a Response Topic (where the answer is to go), Correlation
// Data (which command an answer is for) and a Message Expiry Interval (the
// broker drops it unseen once stale; the backend then gets no answer and
// sees its own timeout), the envelope's deadline saying the same to the
// till.
//
// The till (examples/commands/till) applies each command once, in one
// transaction with its answer, and its relay publishes the answer, at
// least once: an answer that comes twice is the same event (same id), and
// is printed once.
//
//	go run ./examples/commands/backend --broker tcp://127.0.0.1:1883 --till tills/1/commands
//
// It prints a line per command sent, one per command answered, and
// "answered 3 of 3, duplicates 0"; it exits non-zero when an answer is
// missing after --wait.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/edgeoutbox/outbox"
)

func main() {
	log.SetFlags(0)
	if err := run(); err != nil {
		log.Fatalf("backend: %v", err)
	}
}

// answer is what a till answers (docs/commands.md).
type answer struct {
	Command string          `json:"command"`
	Source  string          `json:"source"`
	Status  string          `json:"status"`
	Reason  string          `json:"reason,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
}

// price is the command's data: set an item's price.
type price struct {
	Item       string `json:"item"`
	PriceCents int    `json:"price_cents"`
}

func run() error {
	broker := flag.String("broker", "tcp://127.0.0.1:1883", "the MQTT broker (tcp://host:port)")
	till := flag.String("till", "tills/1/commands", "the till's command topic")
	clientID := flag.String("client-id", "backend-1", "this backend's MQTT client id")
	answers := flag.String("answers", "", "the topic the till answers on (default backend/<client-id>/answers)")
	count := flag.Int("count", 3, "how many price changes to send")
	lifetime := flag.Duration("lifetime", 30*time.Second, "how long a command stays good: its deadline and its MQTT Message Expiry")
	wait := flag.Duration("wait", time.Minute, "how long to wait for the answers")
	flag.Parse()
	if *answers == "" {
		*answers = "backend/" + *clientID + "/answers"
	}
	u, err := url.Parse(*broker)
	if err != nil || u.Scheme != "tcp" || u.Host == "" {
		return fmt.Errorf("--broker %q: want tcp://host:port", *broker)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *wait)
	defer cancel()

	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	sent := map[string]string{}   // correlation data -> command id
	answered := map[string]bool{} // command id -> an answer printed
	seen := map[string]bool{}     // answer event ids
	dups := 0
	all := make(chan struct{})
	onAnswer := func(pr paho.PublishReceived) (bool, error) {
		p := pr.Packet
		var corr []byte
		var user []outbox.UserProperty
		ct := ""
		if p.Properties != nil {
			corr, ct = p.Properties.CorrelationData, p.Properties.ContentType
			for _, kv := range p.Properties.User {
				user = append(user, outbox.UserProperty{Key: kv.Key, Value: kv.Value})
			}
		}
		ev, err := outbox.DecodeEventMQTT(p.Payload, ct, user)
		if err != nil {
			log.Printf("backend: an answer that is not an event: %v", err)
			return true, nil
		}
		var a answer
		if err := json.Unmarshal(ev.Data, &a); err != nil {
			log.Printf("backend: answer %s: %v", ev.ID, err)
			return true, nil
		}
		mu.Lock()
		defer mu.Unlock()
		if seen[ev.ID] {
			dups++ // at least once: the same answer again
			return true, nil
		}
		seen[ev.ID] = true
		id, ok := sent[string(corr)]
		if !ok || id != a.Command {
			log.Printf("backend: answer %s for command %q with correlation data %q: not one of ours", ev.ID, a.Command, corr)
			return true, nil
		}
		if answered[id] {
			log.Printf("backend: command %s answered twice, by two answers (%s the second)", id, ev.ID)
			return true, nil
		}
		answered[id] = true
		line := fmt.Sprintf("answer command=%s status=%s", id, a.Status)
		if a.Reason != "" {
			line += fmt.Sprintf(" reason=%q", a.Reason)
		}
		if len(a.Result) > 0 {
			var compact bytes.Buffer
			if json.Compact(&compact, a.Result) == nil {
				line += " result=" + compact.String()
			}
		}
		fmt.Println(line)
		if len(answered) == *count {
			close(all)
		}
		return true, nil
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){onAnswer}})
	// A clean session: this run waits for the answers to its own
	// commands only. A backend that must get answers across its own
	// restarts keeps a persistent session instead (as consumer.Subscriber
	// does).
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: *clientID, KeepAlive: 30, CleanStart: true})
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if ca.ReasonCode != 0 {
		return fmt.Errorf("connect: refused, reason code %#x", ca.ReasonCode)
	}
	defer c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: *answers, QoS: 1}}}); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	fmt.Printf("subscribed to %s\n", *answers)

	items := []string{"coffee", "tea", "croissant", "bagel", "juice"}
	for i := range *count {
		now := time.Now()
		p := price{Item: items[i%len(items)], PriceCents: 200 + 10*i}
		data, _ := json.Marshal(p)
		id := outbox.NewID()
		env, err := json.Marshal(map[string]any{
			"specversion": "1.0", "id": id, "source": "/backend/" + *clientID, "type": "com.example.price.set",
			"time": now.UTC().Format(time.RFC3339Nano), "deadline": now.Add(*lifetime).UTC().Format(time.RFC3339Nano),
			"datacontenttype": "application/json", "data": json.RawMessage(data),
		})
		if err != nil {
			return err
		}
		corr := fmt.Sprintf("%s#%d", *clientID, i+1)
		mu.Lock()
		sent[corr] = id
		mu.Unlock()
		secs := uint32(lifetime.Seconds())
		_, err = c.Publish(ctx, &paho.Publish{Topic: *till, QoS: 1, Payload: env, Properties: &paho.PublishProperties{
			ContentType: "application/cloudevents+json", ResponseTopic: *answers, CorrelationData: []byte(corr), MessageExpiry: &secs}})
		if err != nil {
			return fmt.Errorf("publish command %s: %w", id, err)
		}
		fmt.Printf("sent command id=%s item=%s price_cents=%d\n", id, p.Item, p.PriceCents)
	}

	select {
	case <-all:
	case <-ctx.Done():
	}
	mu.Lock()
	n, d := len(answered), dups
	mu.Unlock()
	fmt.Printf("answered %d of %d, duplicates %d\n", n, *count, d)
	if n < *count {
		return errors.New("answers missing after --wait (a command that expired at the broker is never answered)")
	}
	return nil
}
