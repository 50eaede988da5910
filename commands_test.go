package outbox

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/migrate"
)

// cmdRig is an outbox whose clocks move only when the test says so: the
// outbox clock (el), the wall clock (wall) and whether it is trusted.
type cmdRig struct {
	ob      *Outbox
	el      *harness.FakeElapsed
	wall    *harness.FixedClock
	trusted atomic.Bool
	asked   atomic.Int64 // how often the trust was asked

	mu      sync.Mutex
	calls   []string // the handler's calls, by command id
	results map[string]func(attempt int) ([]byte, error)
}

var cmdEpoch = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func newCmdRig(t *testing.T) *cmdRig {
	t.Helper()
	r := &cmdRig{el: &harness.FakeElapsed{}, wall: harness.NewFixedClock(cmdEpoch), results: map[string]func(int) ([]byte, error){}}
	r.ob = openTest(t, Options{elapsed: r.el.Elapsed, Now: r.wall.Now})
	_, err := r.ob.DB().Exec(`CREATE TABLE applied (id TEXT NOT NULL)`)
	require.NoError(t, err)
	return r
}

func (r *cmdRig) trust() bool {
	r.asked.Add(1)
	return r.trusted.Load()
}

// handler records each call and the command in the application's table,
// in the command's transaction, and answers as results says (default
// {"ok":true}).
func (r *cmdRig) handler(ctx context.Context, tx *sql.Tx, cmd Command) ([]byte, error) {
	r.mu.Lock()
	r.calls = append(r.calls, cmd.ID)
	f := r.results[cmd.ID]
	r.mu.Unlock()
	if _, err := tx.ExecContext(ctx, `INSERT INTO applied (id) VALUES (?)`, cmd.ID); err != nil {
		return nil, err
	}
	if f != nil {
		return f(cmd.Attempts)
	}
	return []byte(`{"ok":true}`), nil
}

func (r *cmdRig) handlerCalls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// commands returns the rig's Commands, quick to poll.
func (r *cmdRig) commands(t *testing.T, opts CommandOptions) *Commands {
	t.Helper()
	opts.WallClockTrusted = r.trust
	if opts.RetryBackoff.Initial == 0 {
		opts.RetryBackoff = Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond, Jitter: -1}
	}
	c, err := r.ob.NewCommands(r.handler, opts)
	require.NoError(t, err)
	c.poll = 5 * time.Millisecond
	return c
}

func (r *cmdRig) run(t *testing.T, opts CommandOptions) (stop func()) {
	t.Helper()
	return harness.RunInBackground(t, "commands", r.commands(t, opts))
}

func (r *cmdRig) store(t *testing.T, in IncomingCommand) bool {
	t.Helper()
	stored, err := r.ob.StoreCommand(context.Background(), in, r.trust)
	require.NoError(t, err)
	return stored
}

// envelope is a structured-mode command envelope from /backend with id,
// data {"price":1}, sent at sent (zero: no time) and the extensions given
// as name, value pairs.
func envelope(id string, sent time.Time, ext ...string) []byte {
	b := fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"/backend","type":"com.example.price.set","data":{"price":1}`, id)
	if !sent.IsZero() {
		b = fmt.Appendf(b, `,"time":%q`, sent.Format(time.RFC3339Nano))
	}
	for i := 0; i+1 < len(ext); i += 2 {
		b = fmt.Appendf(b, `,%q:%q`, ext[i], ext[i+1])
	}
	return append(b, '}')
}

type cmdRow struct {
	ID, State string
	Attempts  int
	Reason    string
}

func (r *cmdRig) rows(t *testing.T) []cmdRow {
	t.Helper()
	rows, err := r.ob.DB().Query(`SELECT id, state, attempts, coalesce(reason, '') FROM outbox_command ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	var out []cmdRow
	for rows.Next() {
		var c cmdRow
		require.NoError(t, rows.Scan(&c.ID, &c.State, &c.Attempts, &c.Reason))
		out = append(out, c)
	}
	require.NoError(t, rows.Err())
	return out
}

func (r *cmdRig) state(t *testing.T, id string) string {
	t.Helper()
	var s string
	require.NoError(t, r.ob.DB().QueryRow(`SELECT state FROM outbox_command WHERE id = ?`, id).Scan(&s))
	return s
}

type answerRow struct {
	Topic, Payload, Type, ContentType string
	Correlation                       []byte
	Priority                          int
}

func (r *cmdRig) answers(t *testing.T) []answerRow {
	t.Helper()
	rows, err := r.ob.DB().Query(`SELECT topic, CAST(payload AS TEXT), type, content_type, correlation_data, priority FROM outbox ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	var out []answerRow
	for rows.Next() {
		var a answerRow
		require.NoError(t, rows.Scan(&a.Topic, &a.Payload, &a.Type, &a.ContentType, &a.Correlation, &a.Priority))
		out = append(out, a)
	}
	require.NoError(t, rows.Err())
	return out
}

func (r *cmdRig) payloads(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, a := range r.answers(t) {
		out = append(out, a.Payload)
	}
	return out
}

func (r *cmdRig) appliedIDs(t *testing.T) []string {
	t.Helper()
	rows, err := r.ob.DB().Query(`SELECT id FROM applied ORDER BY rowid`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		out = append(out, id)
	}
	require.NoError(t, rows.Err())
	return out
}

func (r *cmdRig) settled(t *testing.T, n int) {
	t.Helper()
	eventually(t, 5*time.Second, fmt.Sprint(n, " commands settled"), func() bool {
		var k int
		require.NoError(t, r.ob.DB().QueryRow(`SELECT count(*) FROM outbox_command WHERE state <> 'received'`).Scan(&k))
		return k >= n
	})
}

// TestCommandAppliedOnceAndAnswered: a command delivered twice (the broker
// redelivers when its acknowledgement was lost) is stored once and applied
// once; its answer goes to its Response Topic with its Correlation Data, at
// MaxPriority, exactly as documented.
func TestCommandAppliedOnceAndAnswered(t *testing.T) {
	r := newCmdRig(t)
	in := IncomingCommand{Topic: "pos/1/commands", Payload: envelope("c1", cmdEpoch), ResponseTopic: "backend/answers", CorrelationData: []byte{7, 0, 7}}
	require.True(t, r.store(t, in))
	require.False(t, r.store(t, in), "a redelivery is a duplicate")
	r.run(t, CommandOptions{})
	r.settled(t, 1)
	require.False(t, r.store(t, in), "a redelivery after it was applied is a duplicate")
	require.Equal(t, []string{"c1"}, r.handlerCalls())
	require.Equal(t, []string{"c1"}, r.appliedIDs(t))
	require.Equal(t, []cmdRow{{"c1", "applied", 0, ""}}, r.rows(t))
	require.Equal(t, []answerRow{{Topic: "backend/answers", Type: AnswerEventType, ContentType: "application/json", Correlation: []byte{7, 0, 7}, Priority: MaxPriority,
		Payload: `{"command":"c1","source":"/backend","status":"applied","result":{"ok":true}}`}}, r.answers(t))
	st, err := r.ob.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, CommandStats{Applied: 1}, st.Commands)
	g, err := r.ob.Gauges(context.Background())
	require.NoError(t, err)
	require.Equal(t, CommandStats{Applied: 1}, g.Commands)
}

// TestCommandEnvelopeForms: binary mode (MQTT 5) and the 3.1.1 envelope's
// extensions give the same command; MQTT 5's properties win over the
// extensions; a handler's nil result gives an answer without one; no answer
// topic, no answer.
func TestCommandEnvelopeForms(t *testing.T) {
	r := newCmdRig(t)
	var got []Command
	r.results["bin"] = func(int) ([]byte, error) { return nil, nil }
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: []byte(`{"price":2}`), ContentType: "application/json",
		User: []UserProperty{{"specversion", "1.0"}, {"id", "bin"}, {"source", "/backend"}, {"type", "t"},
			{"responsetopic", "backend/ext"}, {"correlationdata", base64.StdEncoding.EncodeToString([]byte("x"))}},
		ResponseTopic: "backend/mqtt5", CorrelationData: []byte("y")}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands",
		Payload: envelope("ext", time.Time{}, "responsetopic", "backend/ext", "correlationdata", base64.StdEncoding.EncodeToString([]byte("x")))}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: envelope("none", time.Time{})}))
	opts := CommandOptions{OnCommand: func(c Command, out CommandOutcome, _ error) {
		r.mu.Lock()
		got = append(got, c)
		r.mu.Unlock()
	}}
	r.run(t, opts)
	r.settled(t, 3)
	// OnCommand is called after the commit that settles.
	eventually(t, 10*time.Second, "OnCommand of all three", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(got) == 3 })
	require.Equal(t, []answerRow{
		{Topic: "backend/mqtt5", Type: AnswerEventType, ContentType: "application/json", Correlation: []byte("y"), Priority: MaxPriority,
			Payload: `{"command":"bin","source":"/backend","status":"applied"}`},
		{Topic: "backend/ext", Type: AnswerEventType, ContentType: "application/json", Correlation: []byte("x"), Priority: MaxPriority,
			Payload: `{"command":"ext","source":"/backend","status":"applied","result":{"ok":true}}`},
	}, r.answers(t))
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Len(t, got, 3)
	require.Equal(t, `{"price":2}`, string(got[0].Data))
	require.Equal(t, "application/json", got[0].DataContentType)
	require.Equal(t, `{"price":1}`, string(got[1].Data))
	require.Equal(t, "pos/1/commands", got[1].Topic)
	require.Empty(t, got[2].ResponseTopic)
}

// TestCommandExpiredByMessageExpiry: MQTT 5's Message Expiry Interval as
// delivered runs on the outbox clock from receipt: past it at its turn,
// the command is answered "expired" and the handler never sees it; within
// it, it is applied.
func TestCommandExpiredByMessageExpiry(t *testing.T) {
	r := newCmdRig(t)
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: envelope("stale", time.Time{}), ResponseTopic: "backend/answers", MessageExpiry: 5 * time.Second}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: envelope("fresh", time.Time{}), ResponseTopic: "backend/answers", MessageExpiry: 20 * time.Second}))
	r.el.Advance(6 * time.Second)
	r.run(t, CommandOptions{})
	r.settled(t, 2)
	require.Equal(t, []string{"fresh"}, r.handlerCalls())
	require.Equal(t, []string{
		`{"command":"stale","source":"/backend","status":"expired","reason":"its time ran out before its turn"}`,
		`{"command":"fresh","source":"/backend","status":"applied","result":{"ok":true}}`,
	}, r.payloads(t))
}

// TestCommandExpiredByDeadline: with a trusted wall clock the deadline
// gives the expiry at receipt: a command that arrives past it is stored
// expired and answered at once; one whose deadline passes on the outbox
// clock while it waits expires at its turn.
func TestCommandExpiredByDeadline(t *testing.T) {
	r := newCmdRig(t)
	r.trusted.Store(true)
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers",
		Payload: envelope("late", cmdEpoch.Add(-time.Minute), "deadline", cmdEpoch.Add(-time.Second).Format(time.RFC3339Nano))}))
	require.Equal(t, []cmdRow{{"late", "expired", 0, "its deadline had passed when it arrived"}}, r.rows(t), "settled on arrival, no Commands needed")
	require.Len(t, r.answers(t), 1)
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers",
		Payload: envelope("slow", cmdEpoch, "deadline", cmdEpoch.Add(5*time.Second).Format(time.RFC3339Nano))}))
	r.el.Advance(5 * time.Second)
	r.run(t, CommandOptions{})
	r.settled(t, 2)
	require.Empty(t, r.handlerCalls())
	require.Equal(t, []string{
		`{"command":"late","source":"/backend","status":"expired","reason":"its deadline had passed when it arrived"}`,
		`{"command":"slow","source":"/backend","status":"expired","reason":"its time ran out before its turn"}`,
	}, r.payloads(t))
}

// TestCommandUntrustedClock: a deadline that arrives while the wall clock
// is not trusted, with no MQTT 5 expiry, cannot be judged: the command
// waits, and the ones behind it too (order). Then either the clock becomes
// trusted (the deadline is judged by the wall clock of that moment) and
// they are applied in order, or its lifetime (deadline - time, both the
// sender's clock) passes on the outbox clock and it expires.
func TestCommandUntrustedClock(t *testing.T) {
	// The sender's clock is an hour ahead of the device's: only the
	// difference of its two instants says anything.
	sent := cmdEpoch.Add(time.Hour)
	t.Run("trusted later", func(t *testing.T) {
		r := newCmdRig(t)
		require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers",
			Payload: envelope("wait", sent, "deadline", sent.Add(time.Minute).Format(time.RFC3339Nano))}))
		require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: envelope("behind", time.Time{})}))
		require.Equal(t, []cmdRow{{"wait", "received", 0, reasonWaitingForClock}, {"behind", "received", 0, ""}}, r.rows(t))
		r.run(t, CommandOptions{})
		asked := r.asked.Load()
		eventually(t, 5*time.Second, "the trust asked again and again", func() bool { return r.asked.Load() > asked+5 })
		require.Empty(t, r.handlerCalls(), "nothing applied while the clock is not trusted")
		r.trusted.Store(true)
		r.settled(t, 2)
		require.Equal(t, []string{"wait", "behind"}, r.handlerCalls(), "in order")
		require.Equal(t, []string{"wait", "behind"}, r.appliedIDs(t))
	})
	t.Run("trusted later, past the deadline", func(t *testing.T) {
		r := newCmdRig(t)
		require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers",
			Payload: envelope("wait", time.Time{}, "deadline", cmdEpoch.Add(time.Minute).Format(time.RFC3339Nano))}))
		r.wall.Set(cmdEpoch.Add(2 * time.Minute)) // NTP sets the clock
		r.trusted.Store(true)
		r.run(t, CommandOptions{})
		r.settled(t, 1)
		require.Empty(t, r.handlerCalls())
		require.Equal(t, "expired", r.state(t, "wait"))
	})
	t.Run("lifetime passed", func(t *testing.T) {
		r := newCmdRig(t)
		require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers",
			Payload: envelope("wait", sent, "deadline", sent.Add(10*time.Second).Format(time.RFC3339Nano))}))
		require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: envelope("behind", time.Time{})}))
		r.run(t, CommandOptions{})
		r.el.Advance(9 * time.Second)
		asked := r.asked.Load()
		eventually(t, 5*time.Second, "the trust asked again and again", func() bool { return r.asked.Load() > asked+5 })
		require.Empty(t, r.handlerCalls(), "within its lifetime it waits")
		r.el.Advance(time.Second)
		r.settled(t, 2)
		require.Equal(t, []string{"behind"}, r.handlerCalls())
		require.Equal(t, []string{`{"command":"wait","source":"/backend","status":"expired","reason":"its lifetime passed while the device's clock was not trusted"}`}, r.payloads(t))
	})
	t.Run("MQTT 5 expiry judges alone", func(t *testing.T) {
		r := newCmdRig(t)
		require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", MessageExpiry: time.Minute,
			Payload: envelope("now", sent, "deadline", cmdEpoch.Add(-time.Hour).Format(time.RFC3339Nano))}))
		r.run(t, CommandOptions{})
		r.settled(t, 1)
		require.Equal(t, []string{"now"}, r.handlerCalls(), "an untrusted clock's reading of the deadline is not used")
	})
}

// TestCommandClockJumpAfterReceipt: from receipt on only the outbox clock
// counts: a wall-clock jump forward does not expire a fresh command, nor a
// jump back revive a stale one.
func TestCommandClockJumpAfterReceipt(t *testing.T) {
	r := newCmdRig(t)
	r.trusted.Store(true)
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers",
		Payload: envelope("stale", cmdEpoch, "deadline", cmdEpoch.Add(5*time.Second).Format(time.RFC3339Nano))}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers",
		Payload: envelope("fresh", cmdEpoch, "deadline", cmdEpoch.Add(time.Hour).Format(time.RFC3339Nano))}))
	r.el.Advance(10 * time.Second)
	r.wall.Set(cmdEpoch.Add(-24 * time.Hour)) // back: the stale one looks fresh
	c := r.commands(t, CommandOptions{})
	ctx := context.Background()
	cmd, ok, err := r.ob.nextCommand(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	var seq int64
	var until time.Time
	_, err = c.step(ctx, cmd, &seq, &until)
	require.NoError(t, err)
	require.Equal(t, "expired", r.state(t, "stale"))
	r.wall.Set(cmdEpoch.Add(48 * time.Hour)) // forward: the fresh one looks stale
	cmd, ok, err = r.ob.nextCommand(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = c.step(ctx, cmd, &seq, &until)
	require.NoError(t, err)
	require.Equal(t, "applied", r.state(t, "fresh"))
	require.Equal(t, []string{"fresh"}, r.handlerCalls())
}

// TestCommandHandlerFails: a handler's error rolls its work back and holds
// the command, and the ones behind it, for the retry; at MaxAttempts the
// command is quarantined as failed and answered with the error's text; then
// the next one is applied.
func TestCommandHandlerFails(t *testing.T) {
	r := newCmdRig(t)
	r.results["bad"] = func(int) ([]byte, error) { return nil, errors.New("no paper in the printer") }
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers", Payload: envelope("bad", time.Time{})}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers", Payload: envelope("good", time.Time{})}))
	var mu sync.Mutex
	var outcomes []string
	r.run(t, CommandOptions{MaxAttempts: 3, OnCommand: func(c Command, out CommandOutcome, err error) {
		mu.Lock()
		outcomes = append(outcomes, fmt.Sprintf("%s %s %d %v", c.ID, out, c.Attempts, err))
		mu.Unlock()
	}})
	r.settled(t, 2)
	// OnCommand is called after the commit that settles.
	eventually(t, 10*time.Second, "OnCommand of the last", func() bool { mu.Lock(); defer mu.Unlock(); return len(outcomes) == 4 })
	require.Equal(t, []string{"bad", "bad", "bad", "good"}, r.handlerCalls())
	require.Equal(t, []string{"good"}, r.appliedIDs(t), "the failed attempts' work rolled back")
	require.Equal(t, []cmdRow{{"bad", "failed", 3, "no paper in the printer"}, {"good", "applied", 0, ""}}, r.rows(t))
	require.Equal(t, []string{
		`{"command":"bad","source":"/backend","status":"failed","reason":"no paper in the printer"}`,
		`{"command":"good","source":"/backend","status":"applied","result":{"ok":true}}`,
	}, r.payloads(t))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{
		"bad retry 1 no paper in the printer", "bad retry 2 no paper in the printer", "bad failed 3 no paper in the printer",
		"good applied 0 <nil>",
	}, outcomes)
}

// TestCommandBadResult: a result that is not JSON counts as a failure.
func TestCommandBadResult(t *testing.T) {
	r := newCmdRig(t)
	r.results["c"] = func(int) ([]byte, error) { return []byte("{not json"), nil }
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers", Payload: envelope("c", time.Time{})}))
	r.run(t, CommandOptions{MaxAttempts: 1})
	r.settled(t, 1)
	require.Equal(t, []string{`{"command":"c","source":"/backend","status":"failed","reason":"the handler's result is not one JSON value"}`}, r.payloads(t))
}

// TestCommandMalformed: what is not a command envelope is stored as
// malformed, its payload kept, and answered where an answer topic is known
// (MQTT 5's property, or the extension of a document that says it);
// StoreCommand returns nil, so the transport acknowledges it and the broker
// does not deliver it over and over.
func TestCommandMalformed(t *testing.T) {
	r := newCmdRig(t)
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: []byte("lock the till"), ResponseTopic: "backend/answers", CorrelationData: []byte("k")}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: []byte(`{"specversion":"1.0","source":"/backend","type":"t","responsetopic":"backend/ext"}`)}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: envelope("d", time.Time{}, "deadline", "tomorrow"), ResponseTopic: "backend/answers"}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: envelope("w", time.Time{}), ResponseTopic: "backend/+"}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: []byte("no answer topic")}))
	rows, err := r.ob.DB().Query(`SELECT id, state, reason, CAST(data AS TEXT) FROM outbox_command ORDER BY seq`)
	require.NoError(t, err)
	var reasons []string
	for rows.Next() {
		var id, state, reason, data string
		require.NoError(t, rows.Scan(&id, &state, &reason, &data))
		require.Equal(t, "malformed", state)
		require.Len(t, id, 36, "a new UUIDv7")
		reasons = append(reasons, reason)
		if len(reasons) == 1 {
			require.Equal(t, "lock the till", data, "the raw payload kept")
		}
	}
	require.NoError(t, rows.Err())
	rows.Close()
	require.Len(t, reasons, 5)
	require.Contains(t, reasons[0], "not a command envelope")
	require.Contains(t, reasons[1], "id, source and type are required")
	require.Equal(t, "deadline: not an RFC 3339 timestamp", reasons[2])
	require.Equal(t, "response topic: not a topic this device may publish to", reasons[3])
	a := r.answers(t)
	require.Len(t, a, 3, "answered where a valid answer topic is known")
	require.Equal(t, "backend/answers", a[0].Topic)
	require.Equal(t, []byte("k"), a[0].Correlation)
	require.Equal(t, "backend/ext", a[1].Topic)
	require.True(t, strings.HasPrefix(a[2].Payload, `{"command":"`))
	require.Contains(t, a[2].Payload, `"source":"","status":"malformed","reason":"deadline: not an RFC 3339 timestamp"}`)
	st, err := r.ob.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, CommandStats{Malformed: 5}, st.Commands)
}

// TestCommandBounds: a payload over the stored payload limit is malformed
// without being kept; an id over MaxIDBytes too.
func TestCommandBounds(t *testing.T) {
	r := newCmdRig(t)
	big := fmt.Appendf(nil, `{"specversion":"1.0","id":"big","source":"/b","type":"t","data":"%s"}`, strings.Repeat("x", DefaultMaxPayloadBytes))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: big}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: envelope(strings.Repeat("i", MaxIDBytes+1), time.Time{})}))
	var n, bytes int64
	require.NoError(t, r.ob.DB().QueryRow(`SELECT count(*), sum(length(data)) FROM outbox_command WHERE state = 'malformed'`).Scan(&n, &bytes))
	require.EqualValues(t, 2, n, "both malformed")
	require.Less(t, bytes, int64(1000), "the big payload not kept")

	// A payload limit below an answer's size: settled all the same,
	// unanswered, rather than refused at every redelivery.
	tiny := openTest(t, Options{MaxPayloadBytes: 64})
	stored, err := tiny.StoreCommand(context.Background(), IncomingCommand{Topic: "t", Payload: envelope("c", time.Time{}), ResponseTopic: "backend/answers"}, nil)
	require.NoError(t, err)
	require.True(t, stored)
	st, err := tiny.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, CommandStats{Malformed: 1}, st.Commands)
	require.Zero(t, st.Pending, "no answer")
}

// TestCommandSettledElsewhere: a command another process settled between
// Run's read and its transaction is not applied here (the UPDATE ... WHERE
// state = 'received' changes no row), and not answered twice.
func TestCommandSettledElsewhere(t *testing.T) {
	r := newCmdRig(t)
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers", Payload: envelope("c", time.Time{})}))
	c := r.commands(t, CommandOptions{})
	ctx := context.Background()
	cmd, ok, err := r.ob.nextCommand(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	// Another process, in SQL, as docs/commands.md says.
	_, err = r.ob.DB().Exec(`UPDATE outbox_command SET state = 'applied', done_at = 1 WHERE seq = ? AND state = 'received'`, cmd.Seq)
	require.NoError(t, err)
	var seq int64
	var until time.Time
	_, err = c.step(ctx, cmd, &seq, &until)
	require.NoError(t, err)
	require.Empty(t, r.handlerCalls())
	require.Empty(t, r.answers(t))
}

// TestCommandKeep: settled commands are deleted Keep after receipt on the
// outbox clock, waiting ones never; until then a redelivery is a duplicate.
func TestCommandKeep(t *testing.T) {
	r := newCmdRig(t)
	ctx := context.Background()
	done := IncomingCommand{Topic: "pos/1/commands", Payload: []byte("junk")}
	require.True(t, r.store(t, done))
	wait := IncomingCommand{Topic: "pos/1/commands", Payload: envelope("w", time.Time{}, "deadline", cmdEpoch.Format(time.RFC3339Nano))}
	require.True(t, r.store(t, wait))
	applied := IncomingCommand{Topic: "pos/1/commands", Payload: envelope("a", time.Time{})}
	require.True(t, r.store(t, applied))
	_, err := r.ob.DB().Exec(`UPDATE outbox_command SET state = 'applied' WHERE id = 'a'`)
	require.NoError(t, err)
	n, err := r.ob.purgeCommands(ctx, time.Hour)
	require.NoError(t, err)
	require.Zero(t, n)
	require.False(t, r.store(t, applied), "kept: a duplicate")
	r.el.Advance(time.Hour + time.Millisecond)
	n, err = r.ob.purgeCommands(ctx, time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Equal(t, []cmdRow{{"w", "received", 0, reasonWaitingForClock}}, r.rows(t))
	require.True(t, r.store(t, applied), "forgotten after Keep")
}

// TestExpireCommands: the sweep a receiver runs settles every expired
// waiting command, not only the first in line, with its answer; a trusted
// clock gives the ones waiting for it their expiry.
func TestExpireCommands(t *testing.T) {
	r := newCmdRig(t)
	ctx := context.Background()
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: envelope("a", time.Time{}), MessageExpiry: time.Minute}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: envelope("b", time.Time{}), MessageExpiry: time.Second, ResponseTopic: "backend/answers"}))
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands",
		Payload: envelope("c", time.Time{}, "deadline", cmdEpoch.Add(2*time.Second).Format(time.RFC3339Nano))}))
	r.el.Advance(3 * time.Second)
	n, err := r.ob.ExpireCommands(ctx, r.trust)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, []string{"received", "expired", "received"}, []string{r.state(t, "a"), r.state(t, "b"), r.state(t, "c")})
	require.Len(t, r.answers(t), 1)
	r.trusted.Store(true)
	r.wall.Set(cmdEpoch.Add(3 * time.Second))
	n, err = r.ob.ExpireCommands(ctx, r.trust)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, "expired", r.state(t, "c"))
	st, err := r.ob.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, CommandStats{Waiting: 1, Expired: 2}, st.Commands)
}

// TestMigrationToCommands: a schema 9 file with messages migrates to 10:
// its rows have no correlation data, the commands table is there, empty,
// and holds to the SQL contract (a state it does not know is refused, a
// (source, id) once only).
func TestMigrationToCommands(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v9.db")
	db, err := OpenDB(path, DBOptions{})
	require.NoError(t, err)
	require.NoError(t, migrate.SQLite(context.Background(), db, "outbox_schema", outboxMigrations[:9], "", ErrSchemaTooNew))
	_, err = db.Exec(`INSERT INTO outbox (id, topic, payload, priority) VALUES ('m1', 't', 'p1', 9), ('m2', 't', 'p2', 0)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	ob := openTestPath(t, path, Options{})
	ctx := context.Background()
	st, err := ob.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, 10, st.SchemaVersion)
	require.EqualValues(t, 2, st.Pending)
	require.Equal(t, CommandStats{}, st.Commands)
	var nulls int
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox WHERE correlation_data IS NULL`).Scan(&nulls))
	require.Equal(t, 2, nulls)

	insert := `INSERT INTO outbox_command (id, source, topic, data, received_at, received_clock_ms, state) VALUES (?, 's', 't', x'', 0, 0, ?)`
	_, err = ob.DB().Exec(insert, "a", "received")
	require.NoError(t, err)
	_, err = ob.DB().Exec(insert, "b", "done")
	require.ErrorContains(t, err, "CHECK constraint failed")
	_, err = ob.DB().Exec(insert, "a", "applied")
	require.ErrorContains(t, err, "UNIQUE constraint failed")
	var state string
	require.NoError(t, ob.DB().QueryRow(`SELECT state FROM outbox_command WHERE id = 'a'`).Scan(&state))
	require.Equal(t, "received", state)

	fresh := openTest(t, Options{})
	require.Equal(t, schemaObjects(t, fresh.DB()), schemaObjects(t, ob.DB()), "the same objects as a new file")
}

// TestCommandFromAnotherProcess: a command stored by another process (the
// relay's receiver) is seen by Run through data_version, without a wake.
func TestCommandFromAnotherProcess(t *testing.T) {
	r := newCmdRig(t)
	c := r.commands(t, CommandOptions{})
	c.poll = time.Hour // nothing but data_version can tell it
	harness.RunInBackground(t, "commands", c)
	other, err := Open(context.Background(), dbPath(t, r.ob), Options{Logger: testLogger()})
	require.NoError(t, err)
	defer other.Close()
	stored, err := other.StoreCommand(context.Background(), IncomingCommand{Topic: "pos/1/commands", Payload: envelope("c", time.Time{})}, nil)
	require.NoError(t, err)
	require.True(t, stored)
	r.settled(t, 1)
	require.Equal(t, []string{"c"}, r.appliedIDs(t))
}

// TestStoreCommandAtFull: StoreCommand commits at synchronous=FULL on a
// database opened at NORMAL, and gives its connection back at NORMAL.
func TestStoreCommandAtFull(t *testing.T) {
	ob := openTest(t, Options{Synchronous: SyncNormal})
	ob.DB().SetMaxOpenConns(2)
	var during int
	ob.hooks.commandTx = func(tx *sql.Tx) {
		require.NoError(t, tx.QueryRow(`PRAGMA synchronous`).Scan(&during))
	}
	_, err := ob.StoreCommand(context.Background(), IncomingCommand{Topic: "t", Payload: envelope("c", time.Time{})}, nil)
	require.NoError(t, err)
	require.Equal(t, 2, during, "FULL")
	ctx := context.Background()
	for range 2 { // every connection of the pool
		conn, err := ob.DB().Conn(ctx)
		require.NoError(t, err)
		defer conn.Close()
		var s int
		require.NoError(t, conn.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&s))
		require.Equal(t, 1, s, "NORMAL again")
	}
}

// TestCommandSQLContract: docs/commands.md's SQL, run as written by an
// application in another language, applies a command once and answers it
// exactly as the Go API does; run again on the same command, its UPDATE
// changes no row.
func TestCommandSQLContract(t *testing.T) {
	doc, err := os.ReadFile("docs/commands.md")
	require.NoError(t, err)
	_, block, ok := strings.Cut(string(doc), "```sql\nBEGIN IMMEDIATE;\n")
	require.True(t, ok, "the contract's SQL block")
	block, _, _ = strings.Cut(block, "COMMIT;\n```")
	var stmts []string
	for _, s := range strings.Split(block, ";") {
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			l, _, _ = strings.Cut(l, "--")
			if strings.TrimSpace(l) != "" {
				lines = append(lines, l)
			}
		}
		if len(lines) > 0 {
			stmts = append(stmts, strings.Join(lines, "\n"))
		}
	}
	require.Len(t, stmts, 3, "SELECT, UPDATE, INSERT")

	r := newCmdRig(t)
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", Payload: envelope("c1", time.Time{}), ResponseTopic: "backend/answers", CorrelationData: []byte("k")}))
	apply := func() (int64, error) {
		tx, err := r.ob.DB().Begin()
		require.NoError(t, err)
		defer tx.Rollback()
		var seq int64
		var id, source, typ, ct string
		var data, corr []byte
		var rt sql.NullString
		var expires, deadline sql.NullInt64
		var clk int64
		require.NoError(t, tx.QueryRow(stmts[0]).Scan(&seq, &id, &source, &typ, &ct, &data, &rt, &corr, &expires, &deadline, &clk))
		res, err := tx.Exec(stmts[1], sql.Named("now_ms", 1), sql.Named("seq", seq))
		require.NoError(t, err)
		n, err := res.RowsAffected()
		require.NoError(t, err)
		if n != 1 {
			return n, nil
		}
		_, err = tx.Exec(stmts[2], sql.Named("seq", seq), sql.Named("result", `{"ok":true}`))
		require.NoError(t, err)
		return n, tx.Commit()
	}
	n, err := apply()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, []answerRow{{Topic: "backend/answers", Type: AnswerEventType, ContentType: "application/json", Correlation: []byte("k"), Priority: MaxPriority,
		Payload: `{"command":"c1","source":"/backend","status":"applied","result":{"ok":true}}`}}, r.answers(t), "the Go API's answer, byte for byte")
	require.Equal(t, "applied", r.state(t, "c1"))
	res, err := r.ob.DB().Exec(stmts[1], sql.Named("now_ms", 2), sql.Named("seq", 1))
	require.NoError(t, err)
	n, err = res.RowsAffected()
	require.NoError(t, err)
	require.Zero(t, n, "settled: the UPDATE of a second applier changes nothing")
}

// TestCommandExpiryWhileRelayIdle: an idle relay stops the outbox clock of
// its Outbox (no message's life runs then), but a command's life runs on:
// one waiting for a trusted clock expires once its lifetime has passed,
// whatever the relay in the same process is doing.
func TestCommandExpiryWhileRelayIdle(t *testing.T) {
	r := newCmdRig(t)
	relay, err := r.ob.NewRelay(&fakePublisher{}, fastRelay())
	require.NoError(t, err)
	startRelay(t, relay)
	eventually(t, 5*time.Second, "the relay idle", func() bool { return relay.idleSince.Load() != 0 })
	require.True(t, r.store(t, IncomingCommand{Topic: "pos/1/commands", ResponseTopic: "backend/answers",
		Payload: envelope("wait", cmdEpoch, "deadline", cmdEpoch.Add(10*time.Second).Format(time.RFC3339Nano))}))
	r.run(t, CommandOptions{})
	r.el.Advance(11 * time.Second)
	r.settled(t, 1)
	require.Equal(t, "expired", r.state(t, "wait"))
	require.Empty(t, r.handlerCalls())
}

// FuzzDecodeCommand: whatever a broker delivers, decoding a command never
// panics, and what it lets through as a command to apply is bounded: an
// id, data within the payload limit, an answer topic this device may
// publish to, correlation data MQTT can carry.
func FuzzDecodeCommand(f *testing.F) {
	f.Add([]byte(envelope("c", cmdEpoch, "deadline", cmdEpoch.Format(time.RFC3339Nano), "responsetopic", "a/b", "correlationdata", "eA==")), "", "", "")
	f.Add([]byte(`{"price":1}`), "application/json", "bin", "a/+")
	f.Add([]byte("junk"), "", "", "")
	f.Add([]byte(`{"specversion":"1.0","id":"","source":"s","type":"t"}`), "", "", "$SYS/x")
	f.Fuzz(func(t *testing.T, payload []byte, contentType, id, responseTopic string) {
		o := &Outbox{maxPayload: 1 << 12, prefix: "a/"}
		in := IncomingCommand{Topic: "t", Payload: payload, ContentType: contentType, ResponseTopic: responseTopic}
		if id != "" {
			in.User = []UserProperty{{"specversion", "1.0"}, {"id", id}, {"source", "s"}, {"type", "t"}, {"deadline", string(payload)}}
		}
		c := o.decodeCommand(in)
		if c.responseTopic.Valid {
			require.NoError(t, ValidateTopic(c.responseTopic.String))
			require.True(t, strings.HasPrefix(c.responseTopic.String, o.prefix))
		}
		require.LessOrEqual(t, len(c.correlation), maxBinaryBytes)
		require.LessOrEqual(t, len(c.data), o.maxPayload)
		if c.state == "" {
			require.NotEmpty(t, c.id)
			require.LessOrEqual(t, len(c.id), MaxIDBytes)
			require.NotNil(t, c.data)
		} else {
			require.Equal(t, string(CommandMalformed), c.state)
			require.Len(t, c.id, 36)
			require.True(t, c.reason.Valid)
		}
	})
}
