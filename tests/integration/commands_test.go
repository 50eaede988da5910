package integration

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// What the command fault tests (commandfaults_test.go) share: the till
// process that receives commands from Mosquitto and applies them, the
// backend in the test that sends them and records the answers, and the
// checks of the database and of the answers.

const (
	// commandEnvChild carries a till's orders (commandChild): set,
	// TestCommandTillChild runs them.
	commandEnvChild = "OUTBOX_COMMAND_CHILD"
	commandTopic    = "tills/1/commands"
	commandAnswers  = "backend/answers"
	commandSource   = "/backend"
	// commandReceiver is the till's receiver's MQTT client id: one for
	// every till process, so that the broker keeps one persistent session
	// for them and queues the commands sent while none runs.
	commandReceiver = "till-1-commands"
	// commandInTx starts the line a till prints from inside a command's
	// transaction: the handler has written its row and has not returned.
	commandInTx = "in-tx "
	// commandAnswerType is the answers' CloudEvents type.
	commandAnswerType = "outbox.command.answer"
)

// commandChild is what a till process is to do. It reaches the child as
// JSON in commandEnvChild.
type commandChild struct {
	DB     string
	Broker string // the broker's URL, for the receiver and the relay
	Client string // the relay's MQTT client id and lease owner: this process's name
	Seed   uint64
	Sync   outbox.Synchronous
	// Protocol is the MQTT version of the receiver and of the relay; the
	// tests alternate 5 and 3.1.1 from till to till.
	Protocol outbox.MQTTProtocol
}

// TestCommandTillChild is the till that gets killed. It does nothing
// unless a command fault test started it.
func TestCommandTillChild(t *testing.T) {
	s := os.Getenv(commandEnvChild)
	if s == "" {
		t.Skip("the till of the command fault tests; runs only when started by them")
	}
	var c commandChild
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s: %v\n", childFailed, commandEnvChild, err)
		os.Exit(2)
	}
	c.run()
}

// commandResult is the handler's result, which the answer carries: the
// till that applied the command and the row it wrote, so that an answer
// can be checked against the commit it came from.
type commandResult struct {
	Child string `json:"child"`
	Row   int64  `json:"row"`
}

// run receives commands, applies them (a row in the applied table each,
// written inside the command's transaction, which then lingers for 5 to
// 10 ms so that kills land inside it) and relays the answers; it returns
// never, and exits on a failure or when the parent is gone.
func (c commandChild) run() {
	die := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, childFailed+": "+format+"\n", args...)
		os.Exit(2)
	}
	go func() {
		io.Copy(io.Discard, os.Stdin) // EOF: the parent is gone
		os.Exit(3)
	}()
	level := slog.LevelWarn
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx := context.Background()
	ob, err := outbox.Open(ctx, c.DB, outbox.Options{Logger: logger, Synchronous: c.Sync})
	if err != nil {
		die("open: %v", err)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xc0de))
	var out sync.Mutex // one line at a time on stdout
	handler := func(ctx context.Context, tx *sql.Tx, cmd outbox.Command) ([]byte, error) {
		res, err := tx.ExecContext(ctx, `INSERT INTO applied (command_id, child) VALUES (?, ?)`, cmd.ID, c.Client)
		if err != nil {
			return nil, err
		}
		row, err := res.LastInsertId()
		if err != nil {
			return nil, err
		}
		out.Lock()
		fmt.Fprintln(os.Stdout, commandInTx+cmd.ID)
		out.Unlock()
		// The experiment: the transaction stays open a while, written to,
		// for the parent's kill to land in.
		time.Sleep(time.Duration(5+rng.IntN(6)) * time.Millisecond)
		return json.Marshal(commandResult{Child: c.Client, Row: row})
	}
	cmds, err := ob.NewCommands(handler, outbox.CommandOptions{Logger: logger,
		RetryBackoff: outbox.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}})
	if err != nil {
		die("commands: %v", err)
	}
	go func() {
		die("Commands.Run returned: %v", cmds.Run(ctx))
	}()
	recv, err := ob.NewMQTTCommandReceiver(outbox.MQTTCommandOptions{Broker: c.Broker, ClientID: commandReceiver, Protocol: c.Protocol,
		Topics: []string{commandTopic}, ConnectTimeout: 5 * time.Second, KeepAlive: 5 * time.Second, Logger: logger,
		Reconnect: outbox.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond}})
	if err != nil {
		die("receiver: %v", err)
	}
	go func() {
		die("receiver.Run returned: %v", recv.Run(ctx))
	}()
	pub, err := outbox.NewMQTTPublisher(crashMQTTOptions(c.Broker, c.Client, c.Protocol))
	if err != nil {
		die("publisher: %v", err)
	}
	relay, err := ob.NewRelay(pub, commandRelayOptions(c.Client))
	if err != nil {
		die("relay: %v", err)
	}
	die("relay.Run returned: %v", relay.Run(ctx))
}

// commandRelayOptions are the crash test's relay options, but that sent
// answers are kept (an hour), so that each check finds every answer the
// outbox ever had.
func commandRelayOptions(owner string) outbox.RelayOptions {
	o := crashRelayOptions(owner, false)
	o.Source = "/till/1"
	o.Retention, o.PurgeInterval = time.Hour, time.Hour
	return o
}

// createCommandTill creates the till's database: the outbox and the
// applied table, a row per command application, with no UNIQUE on the
// command's id, so that applying one twice shows.
func createCommandTill(t *testing.T, path string) {
	t.Helper()
	ob, err := outbox.Open(context.Background(), path, outbox.Options{Logger: testLogger(), Synchronous: outbox.SyncFull})
	require.NoError(t, err)
	_, err = ob.DB().Exec(`CREATE TABLE applied (id INTEGER PRIMARY KEY, command_id TEXT NOT NULL, child TEXT NOT NULL)`)
	require.NoError(t, err)
	require.NoError(t, ob.Close())
}

// commandTill is one till process, run by a parent that kills it.
type commandTill struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer // read only once it has exited
	exited chan error
	killed bool

	mu     sync.Mutex
	stdout strings.Builder
	inTx   int           // the in-tx lines so far
	lastTx string        // the command of the last one
	moved  chan struct{} // a pulse at each in-tx line
}

func startCommandTill(t *testing.T, c commandChild) *commandTill {
	t.Helper()
	spec, err := json.Marshal(c)
	require.NoError(t, err)
	p := &commandTill{t: t, name: c.Client, exited: make(chan error, 1), moved: make(chan struct{}, 1)}
	p.cmd = exec.Command(os.Args[0], "-test.run=^TestCommandTillChild$", "-test.timeout=10m")
	p.cmd.Env = append(os.Environ(), commandEnvChild+"="+string(spec))
	p.stdin, err = p.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	p.cmd.Stderr = &p.stderr
	require.NoError(t, p.cmd.Start())
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.stdout.WriteString(sc.Text() + "\n")
			if id, ok := strings.CutPrefix(sc.Text(), commandInTx); ok {
				p.inTx++
				p.lastTx = id
			}
			p.mu.Unlock()
			select {
			case p.moved <- struct{}{}:
			default:
			}
		}
	}()
	go func() {
		<-read // Wait closes the pipe: read it to its end first
		p.exited <- p.cmd.Wait()
	}()
	return p
}

func (p *commandTill) gone() bool {
	select {
	case err := <-p.exited:
		p.exited <- err
		return true
	default:
		return false
	}
}

// runFor lets the till run for d, or until it exits.
func (p *commandTill) runFor(d time.Duration) {
	select {
	case <-time.After(d): // the experiment: when to pull the plug
	case err := <-p.exited:
		p.exited <- err
	}
}

// waitInTx waits until the till has been inside n commands'
// transactions, or for at most d (no command may be waiting), or until it
// exits; it says whether it got there.
func (p *commandTill) waitInTx(n int, d time.Duration) bool {
	deadline := time.After(d)
	for {
		p.mu.Lock()
		got := p.inTx
		p.mu.Unlock()
		if got >= n {
			return true
		}
		select {
		case <-p.moved:
		case <-deadline:
			return false
		case err := <-p.exited:
			p.exited <- err
			return false
		}
	}
}

// lastInTx is the command whose transaction the till entered last; empty
// if none.
func (p *commandTill) lastInTx() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastTx
}

// kill kills the till with SIGKILL and checks that it had not exited by
// itself and wrote no failure.
func (p *commandTill) kill() {
	t := p.t
	t.Helper()
	require.False(t, p.gone(), "%s exited by itself", p.name) // done logs its output
	require.NoError(t, p.cmd.Process.Kill())
	err := <-p.exited
	p.killed = true
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee) && ee.ExitCode() == -1, "%s: want killed by a signal, got %v", p.name, err)
	for _, bad := range []string{"DATA RACE", childFailed, "panic:"} {
		require.NotContains(t, p.stderr.String(), bad, "%s output", p.name)
	}
}

// done leaves no till behind, and logs its output when the test failed or
// verbose is set.
func (p *commandTill) done(verbose bool) {
	if !p.killed {
		p.cmd.Process.Kill()
		<-p.exited
	}
	p.stdin.Close()
	if p.t.Failed() || verbose {
		p.mu.Lock()
		out := p.stdout.String()
		p.mu.Unlock()
		p.t.Logf("%s output:\n%s%s", p.name, p.stderr.String(), out)
	}
}

// commandAnswer is an answer's data (docs/commands.md).
type commandAnswer struct {
	Command string          `json:"command"`
	Source  string          `json:"source"`
	Status  string          `json:"status"`
	Reason  string          `json:"reason"`
	Result  json.RawMessage `json:"result"`
}

// answerDelivery is one answer the backend received.
type answerDelivery struct {
	// corr is the Correlation Data: MQTT 5's property, from a relay
	// speaking 5, or the envelope's extension, from one speaking 3.1.1
	// (the two must agree when both are there).
	corr   string
	event  outbox.Event
	answer commandAnswer
	err    error
}

// commandBackend is the backend: an MQTT 5 client straight at the broker
// that sends commands to the till and records every answer.
type commandBackend struct {
	t *testing.T
	c *paho.Client

	mu      sync.Mutex
	sent    []string // command ids, in the order the broker acknowledged them
	answers []answerDelivery
	n       int // commands made, for their data
	// probes are the commands sent until the till's receiver has a
	// session: those sent before it subscribed reach no one (the broker
	// keeps nothing for a session that does not exist yet), so each is
	// either never stored or applied and answered as any other.
	probes []string
}

func startCommandBackend(t *testing.T, addr string) *commandBackend {
	t.Helper()
	b := &commandBackend{t: t}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	b.c = paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){b.record}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := b.c.Connect(ctx, &paho.Connect{ClientID: "backend", KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	require.Zero(t, ca.ReasonCode)
	t.Cleanup(func() {
		b.c.Disconnect(&paho.Disconnect{})
		<-b.c.Done()
	})
	_, err = b.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: commandAnswers, QoS: 1}}})
	require.NoError(t, err)
	return b
}

func (b *commandBackend) record(pr paho.PublishReceived) (bool, error) {
	p := pr.Packet
	var d answerDelivery
	var user []outbox.UserProperty
	ct := ""
	if p.Properties != nil {
		d.corr, ct = string(p.Properties.CorrelationData), p.Properties.ContentType
		for _, u := range p.Properties.User {
			user = append(user, outbox.UserProperty{Key: u.Key, Value: u.Value})
		}
	}
	d.event, d.err = outbox.DecodeEventMQTT(p.Payload, ct, user)
	if d.err == nil {
		d.err = json.Unmarshal(d.event.Data, &d.answer)
	}
	if ext := string(d.event.CorrelationData); d.err == nil && d.corr != ext {
		if d.corr != "" {
			d.err = fmt.Errorf("correlation data %q in the properties, %q in the envelope", d.corr, ext)
		}
		d.corr = ext
	}
	b.mu.Lock()
	b.answers = append(b.answers, d)
	b.mu.Unlock()
	return true, nil
}

// send sends one command, as the backend would: a CloudEvent with MQTT
// 5's Response Topic and Correlation Data, and the same in the envelope's
// extensions for a till on 3.1.1. It returns once the broker has it. A
// probe is listed apart (probes).
func (b *commandBackend) send(ctx context.Context, probe bool) error {
	b.mu.Lock()
	b.n++
	n := b.n
	b.mu.Unlock()
	id := outbox.NewID()
	env, err := json.Marshal(map[string]any{"specversion": "1.0", "id": id, "source": commandSource, "type": "price.set",
		"datacontenttype": "application/json", "data": map[string]int{"n": n},
		"responsetopic": commandAnswers, "correlationdata": base64.StdEncoding.EncodeToString([]byte(id))})
	if err != nil {
		return err
	}
	_, err = b.c.Publish(ctx, &paho.Publish{Topic: commandTopic, QoS: 1, Payload: env, Properties: &paho.PublishProperties{
		ContentType: "application/cloudevents+json", ResponseTopic: commandAnswers, CorrelationData: []byte(id)}})
	if err != nil {
		return fmt.Errorf("command %d: %w", n, err)
	}
	b.mu.Lock()
	if probe {
		b.probes = append(b.probes, id)
	} else {
		b.sent = append(b.sent, id)
	}
	b.mu.Unlock()
	return nil
}

// sendEvery sends a command every 30 to 90 ms until stop is called, which
// returns the first error: about as fast as tills killed every few
// hundred milliseconds apply them, so that each finds some waiting and the
// last one has no long backlog to finish.
func (b *commandBackend) sendEvery(seed uint64) (stop func() error) {
	rng := rand.New(rand.NewPCG(seed, 0x5e7d))
	quit := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			select {
			case <-quit:
				done <- nil
				return
			case <-time.After(time.Duration(30+rng.IntN(61)) * time.Millisecond): // the pace of the backend
			}
			// Never cancelled half way: a command the broker may have
			// taken is one the test must know of.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := b.send(ctx, false)
			cancel()
			if err != nil {
				done <- err
				return
			}
		}
	}()
	return func() error {
		close(quit)
		return <-done
	}
}

// sentIDs are the commands the broker acknowledged so far.
func (b *commandBackend) sentIDs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.sent...)
}

// expected are the commands that must be applied: those sent, and the
// probes the till stored (s).
func (b *commandBackend) expected(s tillState) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	want := append([]string(nil), b.sent...)
	for _, id := range b.probes {
		if _, ok := s.state[id]; ok {
			want = append(want, id)
		}
	}
	return want
}

// answered says whether one command at least has its answer.
func (b *commandBackend) answered() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.answers) > 0
}

// received returns the answers so far.
func (b *commandBackend) received() []answerDelivery {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]answerDelivery(nil), b.answers...)
}

// answeredAll says whether every command of ids has an answer.
func (b *commandBackend) answeredAll(ids []string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	got := map[string]bool{}
	for _, d := range b.answers {
		got[d.answer.Command] = true
	}
	for _, id := range ids {
		if !got[id] {
			return false
		}
	}
	return true
}

// tillState is what a till's database holds of the commands: the applied
// table's rows by command id, each command's state and attempts, and the
// answers in the outbox by command id.
type tillState struct {
	applied  map[string][]commandResult // command id -> its applications
	state    map[string]string          // command id -> outbox_command.state
	attempts map[string]int
	answers  map[string][]storedAnswer // command id -> its answer rows
}

// storedAnswer is an answer row in the outbox.
type storedAnswer struct {
	id, topic, corr string
	answer          commandAnswer
}

// readTill reads a till's database, as a killed or cut till left it.
func readTill(t *testing.T, db *sql.DB) tillState {
	t.Helper()
	s := tillState{applied: map[string][]commandResult{}, state: map[string]string{}, attempts: map[string]int{}, answers: map[string][]storedAnswer{}}
	rows, err := db.Query(`SELECT id, command_id, child FROM applied ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var r commandResult
		var id string
		require.NoError(t, rows.Scan(&r.Row, &id, &r.Child))
		s.applied[id] = append(s.applied[id], r)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	rows, err = db.Query(`SELECT id, source, state, attempts FROM outbox_command`)
	require.NoError(t, err)
	for rows.Next() {
		var id, source, state string
		var attempts int
		require.NoError(t, rows.Scan(&id, &source, &state, &attempts))
		require.Equal(t, commandSource, source, "command %s", id)
		s.state[id], s.attempts[id] = state, attempts
	}
	require.NoError(t, rows.Err())
	rows.Close()
	rows, err = db.Query(`SELECT id, topic, payload, coalesce(correlation_data, '') FROM outbox WHERE type = ?`, commandAnswerType)
	require.NoError(t, err)
	for rows.Next() {
		var a storedAnswer
		var payload []byte
		require.NoError(t, rows.Scan(&a.id, &a.topic, &payload, &a.corr))
		require.NoError(t, json.Unmarshal(payload, &a.answer), "answer %s", a.id)
		s.answers[a.answer.Command] = append(s.answers[a.answer.Command], a)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	return s
}

// check holds a till's database to the promises, as any kill or cut
// leaves it: a command applied at most once, and applied exactly when it
// is marked applied and has its answer in the outbox (one transaction),
// the answer carrying what that application returned; no command
// expired, failed or charged (nothing here is stale, and a crash must
// never count against a command). It returns how many are applied.
func (s tillState) check(t *testing.T) (applied int) {
	t.Helper()
	for id, rs := range s.applied {
		require.Len(t, rs, 1, "command %s APPLIED %d times: %v", id, len(rs), rs)
		require.Equal(t, "applied", s.state[id], "command %s has its row in the applied table but is %q", id, s.state[id])
	}
	for id, st := range s.state {
		require.Contains(t, []string{"received", "applied"}, st, "command %s", id)
		require.Zero(t, s.attempts[id], "command %s charged %d attempts: a crash must never count against a command", id, s.attempts[id])
		if st != "applied" {
			require.Empty(t, s.answers[id], "command %s is %s, yet answered", id, st)
			continue
		}
		applied++
		require.Len(t, s.applied[id], 1, "command %s is applied: one row in the applied table", id)
		as := s.answers[id]
		require.Len(t, as, 1, "command %s is applied: one answer in the outbox", id)
		a := as[0]
		require.Equal(t, commandAnswers, a.topic)
		require.Equal(t, id, a.corr, "the answer's correlation data")
		require.Equal(t, "applied", a.answer.Status)
		var r commandResult
		require.NoError(t, json.Unmarshal(a.answer.Result, &r))
		require.Equal(t, s.applied[id][0], r, "command %s: the answer is not the applied transaction's", id)
	}
	for id := range s.answers {
		_, ok := s.state[id]
		require.True(t, ok, "an answer in the outbox for command %s, which is not in outbox_command", id)
	}
	return applied
}

// inspectTill opens the database read-only as a killed till left it,
// checks its integrity and the promises, and returns what it holds.
func inspectTill(t *testing.T, path string) tillState {
	t.Helper()
	db := openReadOnly(t, path)
	defer db.Close()
	harness.CheckIntegrity(t, db)
	s := readTill(t, db)
	s.check(t)
	return s
}

// checkAnswers holds the answers the backend received to the till's
// final state: every command sent applied exactly once and answered, each
// answer as often as the relay sent it but always the same event (id and
// data) for one command, never an answer for a command that was not
// applied. It returns the duplicates.
func checkAnswers(t *testing.T, sent []string, ds []answerDelivery, s tillState) (dups int) {
	t.Helper()
	isSent := map[string]bool{}
	for _, id := range sent {
		isSent[id] = true
		_, ok := s.state[id]
		require.True(t, ok, "command %s sent (the broker took it), never stored", id)
	}
	for id := range s.state {
		require.True(t, isSent[id], "command %s stored, never sent", id)
	}
	first := map[string]answerDelivery{}
	for i, d := range ds {
		require.NoError(t, d.err, "answer %d", i)
		id := d.answer.Command
		require.Equal(t, commandAnswerType, d.event.Type, "answer %d", i)
		require.Equal(t, id, d.corr, "answer %d: its correlation data is its command's", i)
		require.Equal(t, "applied", d.answer.Status, "answer %d to %s", i, id)
		require.Len(t, s.applied[id], 1, "an answer to command %s, applied %d times", id, len(s.applied[id]))
		if f, ok := first[id]; ok {
			dups++
			require.Equal(t, f.event.ID, d.event.ID, "command %s answered by two different answers", id)
			require.Equal(t, f.event.Data, d.event.Data, "command %s: the same answer with other data", id)
			continue
		}
		first[id] = d
		var r commandResult
		require.NoError(t, json.Unmarshal(d.answer.Result, &r))
		require.Equal(t, s.applied[id][0], r, "command %s: the answer received is not the applied transaction's", id)
		require.Equal(t, s.answers[id][0].id, d.event.ID, "command %s: the answer received is not the one in the outbox", id)
	}
	for _, id := range sent {
		require.Len(t, s.applied[id], 1, "command %s applied %d times", id, len(s.applied[id]))
		require.Contains(t, first, id, "command %s never answered", id)
	}
	require.Len(t, first, len(sent), "answers to commands never sent")
	return dups
}
