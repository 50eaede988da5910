package main

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho311 "github.com/eclipse/paho.mqtt.golang"
	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/cli"
	"github.com/edgeoutbox/outbox/internal/mqtt"
)

// commandFlags are command send's: the connection's (as the relay's), and
// the command's.
type commandFlags struct {
	conn     relayFlags
	topic    string
	data     string
	typ      string
	source   string
	lifetime time.Duration
	wait     time.Duration
	protocol string
	answer   string
}

func commandCmd(a *cli.App) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "command",
		Short: "Send a command to a device, as a backend would, and wait for its answer",
		Args:  cli.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(commandSendCmd(a))
	return cmd
}

func commandSendCmd(a *cli.App) *cobra.Command {
	var f commandFlags
	cmd := &cobra.Command{
		Use:   "send --broker URL --topic TOPIC",
		Short: "Send a command to a device and wait for its answer",
		Long: `send publishes one command to TOPIC at QoS 1 as a backend would: a
CloudEvent with an id, a source, a type, its time and a deadline (now +
--lifetime); over MQTT 5 with a Response Topic, Correlation Data and a
Message Expiry Interval of the lifetime, over 3.1.1 with the answer topic and
correlation data as the envelope's extensions responsetopic and
correlationdata. It subscribes to a fresh answer topic first, waits for the
device's answer and prints it (its JSON, one line).

The exit status is 0 when the device answered "applied", 1 when it answered
anything else (expired, failed, malformed) or no answer came within --wait.
Over MQTT 5 a command that reaches no device within its lifetime is dropped
by the broker: no answer comes, and --wait ends it.`,
		Example: `  outboxctl command send --broker tcp://broker:1883 --topic tills/7/commands --data '{"lock":true}'
  outboxctl command send --broker ssl://broker:8883 --ca-file ca.pem --username ops --password-env MQTT_PASSWORD \
      --topic tills/7/commands --type till.ping --lifetime 1m --wait 2m --protocol 3.1.1`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.send(cmd.Context(), a)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&f.conn.brokers, "broker", nil, "broker URL: tcp://, mqtt://, ssl://, tls:// or mqtts://HOST:PORT (required)")
	fl.StringVar(&f.conn.username, "username", "", "MQTT user name")
	fl.StringVar(&f.conn.passwordFile, "password-file", "", "read the MQTT password from this file (trailing newline ignored)")
	fl.StringVar(&f.conn.passwordEnv, "password-env", "", "read the MQTT password from this environment variable")
	fl.StringVar(&f.conn.caFile, "ca-file", "", "PEM CA bundle to verify the broker (default: system roots)")
	fl.StringVar(&f.conn.certFile, "cert-file", "", "PEM client certificate for mutual TLS")
	fl.StringVar(&f.conn.keyFile, "key-file", "", "PEM private key of the client certificate")
	fl.StringVar(&f.conn.serverName, "tls-server-name", "", "name to verify in the broker's certificate (default: the URL's host)")
	fl.StringVar(&f.topic, "topic", "", "the device's command topic (required)")
	fl.StringVar(&f.data, "data", "{}", "the command's data, JSON")
	fl.StringVar(&f.typ, "type", "outboxctl.test", "the command's CloudEvents type")
	fl.StringVar(&f.source, "source", "", "the command's CloudEvents source (default /outboxctl/HOST)")
	fl.DurationVar(&f.lifetime, "lifetime", 30*time.Second, "how long the command may wait to be applied: its deadline is now + this")
	fl.DurationVar(&f.wait, "wait", time.Minute, "how long to wait for the answer")
	fl.StringVar(&f.protocol, "protocol", "5", "MQTT version: 5 or 3.1.1")
	fl.StringVar(&f.answer, "answer-topic", "", "where the till answers (default outboxctl/answers/ID); one the till may write and this user read")
	return cmd
}

// commandAnswer is what a device answers (docs/commands.md).
type commandAnswer struct {
	Command string          `json:"command"`
	Source  string          `json:"source"`
	Status  string          `json:"status"`
	Reason  string          `json:"reason,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
}

// send is command send.
func (f *commandFlags) send(ctx context.Context, a *cli.App) error {
	if len(f.conn.brokers) != 1 {
		return cli.Usagef("give one --broker")
	}
	m, err := f.conn.connOptions()
	if err != nil {
		return cli.UsageError{Err: err}
	}
	if err := outbox.ValidateTopic(f.topic); err != nil {
		return cli.Usagef("--topic: %w", err)
	}
	if !json.Valid([]byte(f.data)) {
		return cli.Usagef("--data: not valid JSON")
	}
	if f.answer != "" {
		if err := outbox.ValidateTopic(f.answer); err != nil {
			return cli.Usagef("--answer-topic: %w", err)
		}
	}
	if f.lifetime <= 0 || f.wait <= 0 {
		return cli.Usagef("--lifetime and --wait must be positive")
	}
	v5 := false
	switch f.protocol {
	case "5", "5.0":
		v5 = true
	case "3.1.1", "311", "4":
	default:
		return cli.Usagef("--protocol %q: want 5 or 3.1.1", f.protocol)
	}
	if f.source == "" {
		host, _ := os.Hostname()
		f.source = "/outboxctl/" + host
	}
	u, err := outbox.ParseBrokerURL(m.Brokers[0])
	if err != nil {
		return cli.UsageError{Err: err}
	}
	var tlsCfg *tls.Config
	if m.TLSFiles != nil {
		if tlsCfg, err = m.TLSFiles.Config(); err != nil {
			return cli.UsageError{Err: err}
		}
	}

	id := outbox.NewID()
	now := time.Now()
	answerTopic := f.answer
	if answerTopic == "" {
		answerTopic = "outboxctl/answers/" + id
	}
	correlation := []byte(id)
	env := map[string]any{
		"specversion": "1.0", "id": id, "source": f.source, "type": f.typ,
		"time": now.UTC().Format(time.RFC3339Nano), "deadline": now.Add(f.lifetime).UTC().Format(time.RFC3339Nano),
		"datacontenttype": "application/json", "data": json.RawMessage(f.data),
		// Also over MQTT 5, whose properties win: a bridge that drops
		// them leaves these.
		"responsetopic": answerTopic, "correlationdata": base64.StdEncoding.EncodeToString(correlation),
	}
	payload, err := json.Marshal(env)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.wait)
	defer cancel()
	answers := make(chan []byte, 16)
	dial := func(ctx context.Context) (net.Conn, error) { return mqtt.Dial(ctx, u, tlsCfg, 10*time.Second) }
	clientID := "outboxctl-" + id[len(id)-12:]
	var publish func() error
	if v5 {
		c, err := connect5(ctx, dial, clientID, m, answerTopic, answers)
		if err != nil {
			return err
		}
		defer c.Disconnect(&paho.Disconnect{})
		expiry := uint32((f.lifetime + time.Second - 1) / time.Second)
		publish = func() error {
			_, err := c.Publish(ctx, &paho.Publish{Topic: f.topic, QoS: 1, Payload: payload, Properties: &paho.PublishProperties{
				ResponseTopic: answerTopic, CorrelationData: correlation, MessageExpiry: &expiry, ContentType: "application/cloudevents+json"}})
			return err
		}
	} else {
		c, err := connect311(ctx, dial, clientID, m, answerTopic, answers)
		if err != nil {
			return err
		}
		defer c.Disconnect(250)
		publish = func() error {
			return waitToken(ctx, c.Publish(f.topic, 1, false, payload))
		}
	}
	if err := publish(); err != nil {
		return fmt.Errorf("publish the command: %w", err)
	}
	a.Logger.Info("outboxctl command sent", "id", id, "topic", f.topic, "answer_topic", answerTopic)
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("no answer to command %s within %s (--wait)", id, f.wait)
		case p := <-answers:
			ans, ok := readAnswer(p)
			if !ok || ans.Command != id {
				continue
			}
			line, _ := json.Marshal(ans)
			fmt.Fprintln(a.Stdout, string(line))
			if ans.Status != "applied" {
				return fmt.Errorf("command %s: %s", id, ans.Status)
			}
			return nil
		}
	}
}

// readAnswer reads an answer as a device's relay sends it: a CloudEvent
// whose data is the answer (structured; binary mode's attributes are not
// needed to read its data), or the answer itself (--envelope raw).
func readAnswer(p []byte) (commandAnswer, bool) {
	var ans commandAnswer
	if ev, err := outbox.DecodeEvent(p); err == nil && json.Unmarshal(ev.Data, &ans) == nil && ans.Status != "" {
		return ans, true
	}
	if json.Unmarshal(p, &ans) == nil && ans.Status != "" {
		return ans, true
	}
	return ans, false
}

// connect5 connects over MQTT 5 with a clean session and subscribes to the
// answer topic, handing what arrives to answers.
func connect5(ctx context.Context, dial func(context.Context) (net.Conn, error), clientID string, m outbox.MQTTOptions,
	answerTopic string, answers chan<- []byte) (*paho.Client, error) {
	conn, err := dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) {
			select {
			case answers <- pr.Packet.Payload:
			default:
			}
			return true, nil
		}}})
	cp := &paho.Connect{ClientID: clientID, CleanStart: true, KeepAlive: 30}
	if m.Username != "" {
		cp.UsernameFlag, cp.Username = true, m.Username
		cp.PasswordFlag, cp.Password = true, []byte(m.Password)
	}
	if ca, err := c.Connect(ctx, cp); err != nil {
		conn.Close()
		if ca != nil {
			return nil, fmt.Errorf("connect: the broker refused (reason code 0x%02X)", ca.ReasonCode)
		}
		return nil, fmt.Errorf("connect: %w", err)
	}
	sa, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: answerTopic, QoS: 1}}})
	if err == nil && len(sa.Reasons) > 0 && sa.Reasons[0] >= 0x80 {
		err = fmt.Errorf("reason code 0x%02X", sa.Reasons[0])
	}
	if err != nil {
		c.Disconnect(&paho.Disconnect{})
		return nil, fmt.Errorf("subscribe to the answer topic: %w", err)
	}
	return c, nil
}

// connect311 is connect5 over MQTT 3.1.1.
func connect311(ctx context.Context, dial func(context.Context) (net.Conn, error), clientID string, m outbox.MQTTOptions,
	answerTopic string, answers chan<- []byte) (paho311.Client, error) {
	o := paho311.NewClientOptions().AddBroker("tcp://placeholder:1883").SetClientID(clientID).SetProtocolVersion(4).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectRetry(false).SetOrderMatters(false).SetKeepAlive(30 * time.Second)
	o.SetCustomOpenConnectionFn(func(*url.URL, paho311.ClientOptions) (net.Conn, error) { return dial(ctx) })
	if m.Username != "" {
		o.SetUsername(m.Username)
		o.SetPassword(m.Password)
	}
	c := paho311.NewClient(o)
	if err := waitToken(ctx, c.Connect()); err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	err := waitToken(ctx, c.Subscribe(answerTopic, 1, func(_ paho311.Client, msg paho311.Message) {
		select {
		case answers <- msg.Payload():
		default:
		}
	}))
	if err != nil {
		c.Disconnect(0)
		return nil, fmt.Errorf("subscribe to the answer topic: %w", err)
	}
	return c, nil
}

// waitToken waits for a paho.mqtt.golang token, or ctx.
func waitToken(ctx context.Context, t paho311.Token) error {
	select {
	case <-t.Done():
		return t.Error()
	case <-ctx.Done():
		return errors.New("timed out (--wait)")
	}
}
