package outbox

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho311 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// backend sends commands to tills as a backend would, over one MQTT
// version, and collects the answers on its answer topic (subscribed
// before anything is sent).
type backend struct {
	v5     bool
	topic  string // its answer topic
	c5     *paho.Client
	c311   paho311.Client
	mu     sync.Mutex
	answer []commandAnswer
}

// commandAnswer is one answer the backend received.
type commandAnswer struct {
	Command, Source, Status, Reason string
	Result                          json.RawMessage
	correlation                     []byte // MQTT 5's property, or the envelope's extension
}

// sentCommand is a command for backend.send.
type sentCommand struct {
	id       string
	lifetime time.Duration // its envelope's deadline is now + lifetime; 0: none
	expiry   uint32        // MQTT 5's Message Expiry Interval, seconds; 0: none
	data     string        // JSON; "" is {}
	payload  []byte        // sent as is instead of an envelope (a malformed command)
}

func startBackend(t *testing.T, addr string, v5 bool) *backend {
	t.Helper()
	return startBackendAs(t, addr, v5, "", "", "backend/answers/"+NewID()[26:])
}

// startBackendAs is startBackend with a user name and password (none if
// empty) and its answer topic.
func startBackendAs(t *testing.T, addr string, v5 bool, user, password, answerTopic string) *backend {
	t.Helper()
	b := &backend{v5: v5, topic: answerTopic}
	if v5 {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		b.c5 = paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				var corr []byte
				if pr.Packet.Properties != nil {
					corr = pr.Packet.Properties.CorrelationData
				}
				b.received(t, pr.Packet.Payload, corr)
				return true, nil
			}}})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cp := &paho.Connect{ClientID: "backend-" + NewID()[26:], CleanStart: true, KeepAlive: 30}
		if user != "" {
			cp.UsernameFlag, cp.Username, cp.PasswordFlag, cp.Password = true, user, true, []byte(password)
		}
		_, err = b.c5.Connect(ctx, cp)
		require.NoError(t, err)
		_, err = b.c5.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: b.topic, QoS: 1}}})
		require.NoError(t, err)
		t.Cleanup(func() { b.c5.Disconnect(&paho.Disconnect{}) })
		return b
	}
	o := paho311.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("backend-" + NewID()[26:]).
		SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(true)
	if user != "" {
		o.SetUsername(user).SetPassword(password)
	}
	b.c311 = paho311.NewClient(o)
	tok := b.c311.Connect()
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	tok = b.c311.Subscribe(b.topic, 1, func(_ paho311.Client, m paho311.Message) { b.received(t, m.Payload(), nil) })
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	t.Cleanup(func() { b.c311.Disconnect(0) })
	return b
}

// received keeps an answer: a CloudEvent whose data is the answer.
func (b *backend) received(t *testing.T, payload, corr []byte) {
	ev, err := DecodeEvent(payload)
	var a commandAnswer
	if err == nil {
		err = json.Unmarshal(ev.Data, &a)
	}
	if err != nil {
		t.Errorf("backend: an answer that does not decode: %v", err)
		return
	}
	a.correlation = corr
	if !b.v5 {
		a.correlation = ev.CorrelationData
	}
	b.mu.Lock()
	b.answer = append(b.answer, a)
	b.mu.Unlock()
}

// answers returns the answers received so far, in arrival order.
func (b *backend) answers() []commandAnswer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]commandAnswer(nil), b.answer...)
}

// answerTo returns the answers received to the command id.
func (b *backend) answerTo(id string) []commandAnswer {
	var out []commandAnswer
	for _, a := range b.answers() {
		if a.Command == id {
			out = append(out, a)
		}
	}
	return out
}

// send publishes c to topic at QoS 1, as a CloudEvent with the backend's
// answer topic and the command's id as correlation data: as MQTT 5
// properties over 5, as the envelope's extensions over 3.1.1.
func (b *backend) send(t *testing.T, topic string, c sentCommand) {
	t.Helper()
	payload := c.payload
	if payload == nil {
		now := time.Now()
		env := map[string]any{"specversion": "1.0", "id": c.id, "source": "/backend", "type": "till.command",
			"time": now.UTC().Format(time.RFC3339Nano), "datacontenttype": "application/json", "data": json.RawMessage(`{}`)}
		if c.data != "" {
			env["data"] = json.RawMessage(c.data)
		}
		if c.lifetime > 0 {
			env["deadline"] = now.Add(c.lifetime).UTC().Format(time.RFC3339Nano)
		}
		if !b.v5 {
			env["responsetopic"] = b.topic
			env["correlationdata"] = base64.StdEncoding.EncodeToString([]byte("corr-" + c.id))
		}
		var err error
		payload, err = json.Marshal(env)
		require.NoError(t, err)
	}
	if b.v5 {
		props := &paho.PublishProperties{ResponseTopic: b.topic, CorrelationData: []byte("corr-" + c.id)}
		if c.expiry > 0 {
			props.MessageExpiry = &c.expiry
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := b.c5.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: payload, Properties: props})
		require.NoError(t, err)
		return
	}
	tok := b.c311.Publish(topic, 1, false, payload)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
}

// till is a device: its outbox, the command receiver, Commands applying
// them into the table applied (a row per application, so that a second
// one shows), and the relay that publishes the answers.
type till struct {
	ob       *Outbox
	url      string
	proto    MQTTProtocol
	clientID string
	trusted  func() bool
	topic    string // its command topic
	user     string // its user name and password at the broker, if any
	password string

	recv    *MQTTCommandReceiver
	stopAll func()
}

func newTill(t *testing.T, opts Options, url string, proto MQTTProtocol, trusted func() bool) *till {
	t.Helper()
	ob := openTest(t, opts)
	_, err := ob.DB().Exec(`CREATE TABLE applied (id TEXT NOT NULL, at_clock INTEGER)`)
	require.NoError(t, err)
	id := NewID()[26:]
	return &till{ob: ob, url: url, proto: proto, clientID: "till-" + id + "-commands", trusted: trusted, topic: "tills/" + id + "/commands"}
}

// start runs the till's receiver (before), Commands (unless noApply) and
// relay until stop, or the test's end.
func (d *till) start(t *testing.T, noApply bool, before func(*commandReceiver)) {
	t.Helper()
	r, err := d.ob.NewMQTTCommandReceiver(MQTTCommandOptions{Broker: d.url, ClientID: d.clientID, Topics: []string{d.topic},
		Username: d.user, Password: d.password,
		Protocol: d.proto, WallClockTrusted: d.trusted, KeepAlive: 2 * time.Second, PingTimeout: time.Second, ConnectTimeout: 2 * time.Second,
		Reconnect: Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}, Logger: testLogger()})
	require.NoError(t, err)
	r.r.expireEvery = 50 * time.Millisecond
	if before != nil {
		before(r.r)
	}
	d.recv = r
	var stops []func()
	stops = append(stops, harness.RunInBackground(t, "receiver", r))
	if !noApply {
		stops = append(stops, d.startCommands(t))
	}
	stops = append(stops, d.startRelay(t))
	eventually(t, 10*time.Second, "the receiver subscribed", func() bool { return r.Stats().Connected })
	d.stopAll = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
}

// startRelay runs the till's relay, which publishes the answers.
func (d *till) startRelay(t *testing.T) (stop func()) {
	t.Helper()
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: d.url, ClientID: d.clientID[:len(d.clientID)-len("-commands")],
		Username: d.user, Password: d.password,
		ConnectTimeout: 2 * time.Second, KeepAlive: 2 * time.Second, PingTimeout: time.Second, Protocol: d.proto, Logger: testLogger()})
	require.NoError(t, err)
	relay, err := d.ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	stopRelay := startRelay(t, relay)
	return func() { stopRelay(); pub.Close() }
}

// startCommands runs Commands on the till, applying into applied.
func (d *till) startCommands(t *testing.T) (stop func()) {
	t.Helper()
	c, err := d.ob.NewCommands(func(ctx context.Context, tx *sql.Tx, cmd Command) ([]byte, error) {
		_, err := tx.Exec(`INSERT INTO applied (id) VALUES (?)`, cmd.ID)
		return []byte(`{"ok":true}`), err
	}, CommandOptions{WallClockTrusted: d.trusted, RetryBackoff: Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}, Logger: testLogger()})
	require.NoError(t, err)
	return harness.RunInBackground(t, "commands", runner(c.Run))
}

// runner is a Run function as harness.RunInBackground takes it: Commands.Run
// returns ctx's error when stopped, which is its way of saying it ended
// well.
type runner func(context.Context) error

func (r runner) Run(ctx context.Context) error {
	if err := r(ctx); err != nil && err != ctx.Err() {
		return err
	}
	return nil
}

// applications counts the times the till applied the command id.
func (d *till) applications(t *testing.T, id string) (n int) {
	t.Helper()
	require.NoError(t, d.ob.DB().QueryRow(`SELECT count(*) FROM applied WHERE id = ?`, id).Scan(&n))
	return n
}

// commandRows counts the till's rows of the command id, and returns the
// state of the last.
func (d *till) command(t *testing.T, id string) (rows int, state string) {
	t.Helper()
	require.NoError(t, d.ob.DB().QueryRow(`SELECT count(*), coalesce(max(state), '') FROM outbox_command WHERE id = ?`, id).Scan(&rows, &state))
	return rows, state
}

func alwaysTrusted() bool { return true }

// TestCommandsOffline is the issue's: the till is away (its session kept
// on the broker); three commands are sent, the second with a short
// lifetime; the till comes back after that lifetime has passed: the first
// and third are applied exactly once and answered "applied", the second is
// not applied. How it ends depends on how its expiry was given:
//   - over 3.1.1, by the envelope's deadline, judged with a trusted clock:
//     answered "expired";
//   - over 5 with only the envelope's deadline: the same;
//   - over 5 with a Message Expiry Interval: the broker drops it unseen, so
//     the till never hears of it and the backend gets no answer (its own
//     timeout is its answer).
//
// The figures: a 5 s lifetime, 10 s away; the three cases side by
// side.
func TestCommandsOffline(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	for _, c := range []struct {
		name      string
		proto     MQTTProtocol
		expiry    bool // the short one has a Message Expiry Interval
		answered  bool // the short one is answered "expired"
		storedToo bool // the till stored it
	}{
		{"3.1.1 deadline", Protocol311, false, true, true},
		{"5 deadline", Protocol5, false, true, true},
		{"5 message expiry", Protocol5, true, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := newTill(t, Options{}, m.URL(), c.proto, alwaysTrusted)
			d.start(t, false, nil) // the session is made
			d.stopAll()
			b := startBackend(t, m.Addr(), c.proto == Protocol5)
			short := sentCommand{id: "short", lifetime: 5 * time.Second}
			if c.expiry {
				short.expiry = 5
			}
			cmds := []sentCommand{{id: "first", lifetime: time.Minute}, short, {id: "third", lifetime: time.Minute}}
			for _, cmd := range cmds {
				b.send(t, d.topic, cmd)
			}
			// Away for twice the short lifetime (the scenario, not a
			// wait for something): the broker or the deadline has it
			// expired when the till comes back.
			time.Sleep(10 * time.Second)
			d.start(t, false, nil)
			eventually(t, 10*time.Second, "the first and third answered", func() bool {
				return len(b.answerTo("first")) > 0 && len(b.answerTo("third")) > 0
			})
			if c.answered {
				eventually(t, 5*time.Second, "the short one answered", func() bool { return len(b.answerTo("short")) > 0 })
			}
			d.stopAll()
			for _, id := range []string{"first", "third"} {
				require.Equal(t, 1, d.applications(t, id), id)
				a := b.answerTo(id)
				require.Len(t, a, 1, id)
				require.Equal(t, "applied", a[0].Status, id)
				require.JSONEq(t, `{"ok":true}`, string(a[0].Result), id)
				require.Equal(t, "corr-"+id, string(a[0].correlation), id)
			}
			require.Zero(t, d.applications(t, "short"), "the stale command was applied")
			rows, state := d.command(t, "short")
			if !c.storedToo {
				// Answers go in commit order, the short one's before the
				// third's: had the till seen it, its answer would be here.
				require.Zero(t, rows, "the broker delivered a command past its Message Expiry")
				require.Empty(t, b.answerTo("short"))
				return
			}
			require.Equal(t, 1, rows)
			require.Equal(t, "expired", state)
			a := b.answerTo("short")
			require.Len(t, a, 1)
			require.Equal(t, "expired", a[0].Status)
			require.NotEmpty(t, a[0].Reason)
			require.Equal(t, "corr-short", string(a[0].correlation))
		})
	}
}

// TestCommandsClockJump: the till's wall clock jumps a day forward or back
// (an RTC reset, an NTP step) at receipt or between receipt and apply; no
// stale command is applied and no fresh one expired. Between receipt and
// apply only the outbox clock counts. At receipt the jumped clock is not
// trusted (the kernel says so until NTP has disciplined it): a fresh
// command waits for a trusted clock and is applied once there is one, a
// stale one expires once its lifetime has passed on the outbox clock.
func TestCommandsClockJump(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	const day = 24 * time.Hour
	for _, c := range []struct {
		name      string
		jump      time.Duration
		atReceipt bool // the jump comes before receipt (untrusted), else between receipt and apply
		stale     bool // the command's lifetime is past when Commands runs
		wantState string
		sweepOnly bool // no Commands runs (an application in another language): the receiver's sweep expires it
	}{
		{"forward a day after receipt, fresh", day, false, false, "applied", false},
		{"back a day after receipt, stale", -day, false, true, "expired", false},
		{"forward a day at receipt, fresh", day, true, false, "applied", false},
		{"back a day at receipt, stale", -day, true, true, "expired", false},
		{"back a day at receipt, stale, no Commands", -day, true, true, "expired", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := &harness.JumpyClock{}
			var trusted atomic.Bool
			trusted.Store(!c.atReceipt)
			var elapsed harness.FakeElapsed
			d := newTill(t, Options{Now: clock.Now, elapsed: elapsed.Elapsed}, m.URL(), Protocol311, trusted.Load)
			b := startBackend(t, m.Addr(), false)
			if c.atReceipt {
				clock.Jump(c.jump)
			}
			d.start(t, true, nil) // receives, does not apply
			lifetime := time.Minute
			if c.stale {
				lifetime = time.Second
			}
			b.send(t, d.topic, sentCommand{id: "cmd", lifetime: lifetime})
			eventually(t, 10*time.Second, "stored", func() bool { n, _ := d.command(t, "cmd"); return n == 1 })
			if !c.atReceipt {
				clock.Jump(c.jump)
			}
			if c.stale {
				// Its lifetime passes on the outbox clock, whatever the
				// wall clock says.
				elapsed.Advance(2 * time.Second)
			}
			if c.atReceipt && !c.stale {
				// Waiting for a trusted clock: not expired.
				n, err := d.ob.ExpireCommands(context.Background(), trusted.Load)
				require.NoError(t, err)
				require.Zero(t, n)
				_, state := d.command(t, "cmd")
				require.Equal(t, "received", state, "a fresh command settled while the clock was not trusted")
				clock.Jump(-c.jump) // NTP steps it back, and the kernel trusts it
				trusted.Store(true)
			}
			if !c.sweepOnly {
				defer d.startCommands(t)()
			}
			eventually(t, 10*time.Second, "settled", func() bool { _, s := d.command(t, "cmd"); return s != "received" })
			eventually(t, 10*time.Second, "answered", func() bool { return len(b.answerTo("cmd")) > 0 })
			d.stopAll()
			_, state := d.command(t, "cmd")
			require.Equal(t, c.wantState, state)
			require.Equal(t, map[bool]int{true: 1, false: 0}[c.wantState == "applied"], d.applications(t, "cmd"))
			require.Equal(t, c.wantState, b.answerTo("cmd")[0].Status)
		})
	}
}

// TestCommandReceiverRedelivery: a command stored whose PUBACK is lost (a
// crash between the commit and the acknowledgement) comes again on the
// resumed session and is recognised: stored once, applied once, answered
// once; the command behind it is not held up. Over both versions.
func TestCommandReceiverRedelivery(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	for _, proto := range []MQTTProtocol{Protocol311, Protocol5} {
		t.Run(proto.String(), func(t *testing.T) {
			d := newTill(t, Options{}, m.URL(), proto, alwaysTrusted)
			var dropped atomic.Int64
			d.start(t, false, func(r *commandReceiver) {
				r.beforeAck = func(in IncomingCommand) bool {
					return dropped.Load() > 0 || !dropped.CompareAndSwap(0, 1)
				}
			})
			b := startBackend(t, m.Addr(), proto == Protocol5)
			b.send(t, d.topic, sentCommand{id: "once", lifetime: time.Minute})
			b.send(t, d.topic, sentCommand{id: "next", lifetime: time.Minute})
			eventually(t, 10*time.Second, "both answered", func() bool {
				return len(b.answerTo("once")) > 0 && len(b.answerTo("next")) > 0
			})
			st := d.recv.Stats()
			d.stopAll()
			require.EqualValues(t, 1, dropped.Load())
			require.GreaterOrEqual(t, st.Duplicates, int64(1), "the command was not delivered again")
			for _, id := range []string{"once", "next"} {
				rows, state := d.command(t, id)
				require.Equal(t, 1, rows, id)
				require.Equal(t, "applied", state, id)
				require.Equal(t, 1, d.applications(t, id), id)
				require.Len(t, b.answerTo(id), 1, id)
			}
		})
	}
}

// TestCommandReceiverMalformed: a payload that is no command envelope is
// stored as malformed, acknowledged (it does not come again) and answered
// "malformed" when the answer topic is known (MQTT 5's Response Topic); the
// command behind it is applied.
func TestCommandReceiverMalformed(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	for _, proto := range []MQTTProtocol{Protocol311, Protocol5} {
		t.Run(proto.String(), func(t *testing.T) {
			d := newTill(t, Options{}, m.URL(), proto, alwaysTrusted)
			d.start(t, false, nil)
			b := startBackend(t, m.Addr(), proto == Protocol5)
			b.send(t, d.topic, sentCommand{payload: []byte(`{"not": "a command"`)})
			b.send(t, d.topic, sentCommand{id: "good", lifetime: time.Minute})
			eventually(t, 10*time.Second, "the good one answered", func() bool { return len(b.answerTo("good")) > 0 })
			var malformed int
			require.NoError(t, d.ob.DB().QueryRow(`SELECT count(*) FROM outbox_command WHERE state = 'malformed'`).Scan(&malformed))
			require.Equal(t, 1, malformed)
			require.Equal(t, 1, d.applications(t, "good"))
			if proto == Protocol5 {
				// The malformed one's answer was committed before the
				// good one's and goes first.
				as := b.answers()
				require.Len(t, as, 2)
				require.Equal(t, "malformed", as[0].Status)
			}
			// Counted once StoreCommand has returned, a moment after the
			// commit the answer followed.
			eventually(t, 10*time.Second, "both counted", func() bool { return d.recv.Stats().Stored == 2 })
			st := d.recv.Stats()
			d.stopAll()
			require.EqualValues(t, 2, st.Stored)
			require.Zero(t, st.Duplicates)
		})
	}
}

// TestCommandReceiverStoreErrorRedelivers: while the database refuses to
// store a command, it is not acknowledged: the session ends and resumes,
// the broker delivers it again, and once the database takes it, it is
// stored once.
func TestCommandReceiverStoreErrorRedelivers(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	d := newTill(t, Options{}, m.URL(), Protocol5, alwaysTrusted)
	// A trigger that refuses every command, as a full disk would.
	_, err := d.ob.DB().Exec(`CREATE TRIGGER refuse BEFORE INSERT ON outbox_command BEGIN SELECT RAISE(ABORT, 'refused by the test'); END`)
	require.NoError(t, err)
	d.start(t, true, nil)
	b := startBackend(t, m.Addr(), true)
	b.send(t, d.topic, sentCommand{id: "later", lifetime: time.Minute})
	eventually(t, 10*time.Second, "store errors", func() bool { return d.recv.Stats().StoreErrors >= 2 })
	_, err = d.ob.DB().Exec(`DROP TRIGGER refuse`)
	require.NoError(t, err)
	// The receiver counts a command once StoreCommand has returned, a
	// moment after its row is visible: wait for both.
	eventually(t, 10*time.Second, "stored and counted", func() bool {
		n, _ := d.command(t, "later")
		return n == 1 && d.recv.Stats().Stored == 1
	})
	d.stopAll()
	require.EqualValues(t, 1, d.recv.Stats().Stored)
	rows, _ := d.command(t, "later")
	require.Equal(t, 1, rows)
}

// TestNewMQTTCommandReceiverChecks: the receiver refuses at construction
// what would fail later or lose commands.
func TestNewMQTTCommandReceiverChecks(t *testing.T) {
	ob := openTest(t, Options{})
	ok := MQTTCommandOptions{Broker: "tcp://127.0.0.1:1883", ClientID: "till-1-commands", Topics: []string{"tills/1/commands/#"}}
	_, err := ob.NewMQTTCommandReceiver(ok)
	require.NoError(t, err)
	for _, c := range []struct {
		mod  func(*MQTTCommandOptions)
		want string
	}{
		{func(o *MQTTCommandOptions) { o.ClientID = "" }, "ClientID is required"},
		{func(o *MQTTCommandOptions) { o.Topics = nil }, "no Topics"},
		{func(o *MQTTCommandOptions) { o.Broker = "" }, "broker"},
		{func(o *MQTTCommandOptions) { o.Topics = []string{""} }, "empty"},
		{func(o *MQTTCommandOptions) { o.Topics = []string{"tills/#/x"} }, "'#' must be the whole last level"},
		{func(o *MQTTCommandOptions) { o.Topics = []string{"tills/a+"} }, "'+' must be a whole level"},
		{func(o *MQTTCommandOptions) { o.Topics = []string{"$share/g/tills/1"} }, "shared subscription"},
		{func(o *MQTTCommandOptions) { o.Topics = []string{"tills/\xff"} }, "UTF-8"},
		{func(o *MQTTCommandOptions) { o.Protocol = 9 }, "unknown Protocol"},
	} {
		o := ok
		c.mod(&o)
		_, err := ob.NewMQTTCommandReceiver(o)
		require.ErrorContains(t, err, c.want, fmt.Sprintf("%+v", o))
	}
}

// TestCommandsExpireWhileRelayIdle: a stored command's lifetime runs out on
// the outbox clock while the relay has nothing to publish, and the
// receiver's sweep expires it, so that an application that applies
// commands later (one in another language, or Commands held up) never
// applies it stale.
//
// An idle relay stops the outbox clock (no message's life is running);
// commands measure on a clock that does not stop.
func TestCommandsExpireWhileRelayIdle(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	var elapsed harness.FakeElapsed
	d := newTill(t, Options{elapsed: elapsed.Elapsed}, m.URL(), Protocol311, alwaysTrusted)
	d.start(t, true, func(r *commandReceiver) { r.expireEvery = time.Hour })
	b := startBackend(t, m.Addr(), false)
	b.send(t, d.topic, sentCommand{id: "cmd", lifetime: time.Second})
	eventually(t, 10*time.Second, "stored", func() bool { n, _ := d.command(t, "cmd"); return n == 1 })
	elapsed.Advance(2 * time.Second)
	n, err := d.ob.ExpireCommands(context.Background(), alwaysTrusted)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "not expired: the outbox clock says %d ms", d.ob.clock.Now())
	eventually(t, 10*time.Second, "answered", func() bool { return len(b.answerTo("cmd")) > 0 })
	d.stopAll()
	require.Equal(t, "expired", b.answerTo("cmd")[0].Status)
}

// TestCommandReceiverMessageExpiry: over MQTT 5 a command's Message Expiry
// Interval, as the broker delivered it, is judged on the outbox clock
// whatever the wall clock (not trusted here): it expires once the
// interval has passed there, and is answered "expired" by the receiver's
// sweep; one whose interval has not passed is applied.
func TestCommandReceiverMessageExpiry(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	var elapsed harness.FakeElapsed
	never := func() bool { return false }
	d := newTill(t, Options{elapsed: elapsed.Elapsed}, m.URL(), Protocol5, never)
	d.start(t, true, nil)
	b := startBackend(t, m.Addr(), true)
	b.send(t, d.topic, sentCommand{id: "stale", expiry: 60})
	eventually(t, 10*time.Second, "stored", func() bool { n, _ := d.command(t, "stale"); return n == 1 })
	elapsed.Advance(61 * time.Second)
	eventually(t, 10*time.Second, "expired by the sweep", func() bool { _, s := d.command(t, "stale"); return s == "expired" })
	b.send(t, d.topic, sentCommand{id: "fresh", expiry: 60})
	eventually(t, 10*time.Second, "stored", func() bool { n, _ := d.command(t, "fresh"); return n == 1 })
	defer d.startCommands(t)()
	eventually(t, 10*time.Second, "both answered", func() bool { return len(b.answerTo("stale")) > 0 && len(b.answerTo("fresh")) > 0 })
	require.Equal(t, "expired", b.answerTo("stale")[0].Status)
	require.Equal(t, "applied", b.answerTo("fresh")[0].Status)
	require.Zero(t, d.applications(t, "stale"))
	require.Equal(t, 1, d.applications(t, "fresh"))
}

// commandsACL is docs/commands.md's Mosquitto ACL for commands, as
// written there.
const commandsACL = `# The backend: sends every till's commands, reads their answers.
user backend
topic write tills/+/commands
topic read tills/+/answers/#

# Each till, by its user name: reads its own commands, writes its own
# answers and events. Nobody else may write to its command topic.
pattern read tills/%u/commands
pattern write tills/%u/answers/#
pattern write tills/%u/events/#
`

// TestCommandsMosquittoACL: with docs/commands.md's ACL, a till applies
// the commands of the backend and answers them, while a command another
// till writes to its command topic never reaches it (Mosquitto drops it:
// over 3.1.1 silently).
func TestCommandsMosquittoACL(t *testing.T) {
	dir := t.TempDir()
	passwd := harness.MosquittoPasswordFile(t, dir, "backend", "backend-pw")
	for _, u := range []string{"7", "8"} {
		out, err := exec.Command("mosquitto_passwd", "-b", passwd, u, "till-pw-"+u).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	acl := filepath.Join(dir, "acl")
	require.NoError(t, os.WriteFile(acl, []byte(commandsACL), 0o600))
	m := harness.StartMosquitto(t, harness.MosquittoOptions{Config: []string{
		"allow_anonymous false", "password_file " + passwd, "acl_file " + acl, "max_queued_messages 0"}})
	d := newTill(t, Options{}, m.URL(), Protocol311, alwaysTrusted)
	d.topic, d.user, d.password = "tills/7/commands", "7", "till-pw-7"
	d.start(t, false, nil)
	intruder := startBackendAs(t, m.Addr(), false, "8", "till-pw-8", "tills/8/answers/x")
	b := startBackendAs(t, m.Addr(), false, "backend", "backend-pw", "tills/7/answers/backend")
	intruder.send(t, d.topic, sentCommand{id: "forged", lifetime: time.Minute})
	b.send(t, d.topic, sentCommand{id: "legit", lifetime: time.Minute})
	eventually(t, 10*time.Second, "the backend's command answered", func() bool { return len(b.answerTo("legit")) > 0 })
	d.stopAll()
	require.Equal(t, "applied", b.answerTo("legit")[0].Status)
	require.Equal(t, 1, d.applications(t, "legit"))
	// Both went to one topic, the forged first: had the broker let it
	// through, it would have been stored before the legit one.
	rows, _ := d.command(t, "forged")
	require.Zero(t, rows, "another till's command reached the till")
	require.Empty(t, intruder.answers())
}

// commandsNATS is docs/commands.md's NATS authorization for commands, as
// written there (MQTT topics are checked as NATS subjects: tills/7/commands
// is tills.7.commands).
const commandsNATS = `authorization {
  users = [
    { user: backend, password: backend-pw, allowed_connection_types: ["MQTT"],
      permissions: { publish: ["tills.*.commands"], subscribe: ["tills.*.answers.>", "$MQTT.sub.>"] } }
    { user: till-7, password: till-pw-7, allowed_connection_types: ["MQTT"],
      permissions: { publish: ["tills.7.answers.>", "tills.7.events.>"], subscribe: ["tills.7.commands", "$MQTT.sub.>"] } }
    { user: till-8, password: till-pw-8, allowed_connection_types: ["MQTT"],
      permissions: { publish: ["tills.8.answers.>", "tills.8.events.>"], subscribe: ["tills.8.commands", "$MQTT.sub.>"] } }
  ]
}`

// TestCommandsNATSAuthorization: TestCommandsMosquittoACL on NATS's MQTT
// listener (3.1.1 only), with docs/commands.md's authorization.
func TestCommandsNATSAuthorization(t *testing.T) {
	n := harness.StartNATSWith(t, []string{commandsNATS})
	d := newTill(t, Options{}, "tcp://"+n.MQTTAddr, Protocol311, alwaysTrusted)
	d.topic, d.user, d.password = "tills/7/commands", "till-7", "till-pw-7"
	d.start(t, false, nil)
	intruder := startBackendAs(t, n.MQTTAddr, false, "till-8", "till-pw-8", "tills/8/answers/x")
	b := startBackendAs(t, n.MQTTAddr, false, "backend", "backend-pw", "tills/7/answers/backend")
	intruder.send(t, d.topic, sentCommand{id: "forged", lifetime: time.Minute})
	b.send(t, d.topic, sentCommand{id: "legit", lifetime: time.Minute})
	eventually(t, 20*time.Second, "the backend's command answered", func() bool { return len(b.answerTo("legit")) > 0 })
	d.stopAll()
	require.Equal(t, "applied", b.answerTo("legit")[0].Status)
	require.Equal(t, 1, d.applications(t, "legit"))
	rows, _ := d.command(t, "forged")
	require.Zero(t, rows, "another till's command reached the till")
	require.Empty(t, intruder.answers())
}

// TestCommandReceiverAnnouncesPacketLimit: the receiver bounds a command's
// packet by what StoreCommand could store, the payload limit and room for
// the topic and properties, and over MQTT 5 tells the broker so (Maximum
// Packet Size), which then drops a larger command for it.
func TestCommandReceiverAnnouncesPacketLimit(t *testing.T) {
	b := harness.StartFakeBroker(t, harness.FakeBrokerOptions{})
	ob := openTest(t, Options{MaxPayloadBytes: 100_000})
	r, err := ob.NewMQTTCommandReceiver(MQTTCommandOptions{Broker: b.URL(), ClientID: "till-1-commands",
		Topics: []string{"tills/1/commands/#"}, Protocol: Protocol5})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	eventually(t, 10*time.Second, "connected", func() bool { return len(b.Connects()) > 0 && b.Connects()[0].Level == 5 })
	cancel()
	require.NoError(t, <-done)
	require.EqualValues(t, 100_000+commandPacketRoom, b.Connects()[0].MaxPacket)
}
