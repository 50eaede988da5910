package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/edgeoutbox/outbox/internal/txn"
)

// Command is one command received (a row of outbox_command), as the
// handler sees it.
type Command struct {
	// Seq is its arrival order on this device.
	Seq int64
	// ID and Source are the envelope's: a command is applied once per
	// (Source, ID).
	ID, Source string
	// Type and DataContentType are the envelope's type and datacontenttype.
	Type, DataContentType string
	// Topic is the topic it arrived on.
	Topic string
	// Data is the envelope's data.
	Data []byte
	// Time is the envelope's time and Deadline its deadline extension, by
	// the sender's clock; zero when absent. The outbox judges the deadline
	// (docs/commands.md): a handler is never given a command past it.
	Time, Deadline time.Time
	// ResponseTopic is where its answer goes; empty: no answer is sent.
	ResponseTopic string
	// CorrelationData goes back with the answer.
	CorrelationData []byte
	// Attempts counts the handler's failures on it so far.
	Attempts int
}

// CommandHandler applies one command in tx, the transaction in which the
// command is marked applied and its answer enqueued: it does its work on
// the application's tables in tx and may Enqueue other events in it. It
// returns the answer's result, a JSON value (nil: none), or an error: the
// transaction rolls back and the command is tried again after
// CommandOptions.RetryBackoff, up to MaxAttempts; then it is quarantined as
// failed and the error's text goes to the sender in the answer. It must
// not commit or roll tx back, nor have effects outside tx. tx holds the
// database's write lock while the handler runs, as any write transaction
// does: the application's other writers wait for it, so keep it short.
type CommandHandler func(ctx context.Context, tx *sql.Tx, cmd Command) (result []byte, err error)

// CommandOutcome is what became of a command: the state it was left in.
type CommandOutcome string

// The outcomes of a command, which are the values of outbox_command.state
// but the first.
const (
	// CommandApplied: the handler applied it; its answer is enqueued.
	CommandApplied CommandOutcome = "applied"
	// CommandExpired: it arrived, or waited, past its expiry; the handler
	// was not called.
	CommandExpired CommandOutcome = "expired"
	// CommandFailed: the handler failed it MaxAttempts times; quarantined.
	CommandFailed CommandOutcome = "failed"
	// CommandMalformed: not a valid command envelope; quarantined on
	// arrival.
	CommandMalformed CommandOutcome = "malformed"
	// CommandRetry: the handler failed it and it will be tried again.
	CommandRetry CommandOutcome = "retry"
)

// CommandOptions configures Commands. The zero value is ready to use.
type CommandOptions struct {
	// MaxAttempts is how many times the handler may fail a command before
	// it is quarantined as failed. Zero means 5.
	MaxAttempts int
	// RetryBackoff is the wait after a failure before the same command is
	// tried again. Zero fields mean 1 s initially, 1 min at most.
	RetryBackoff Backoff
	// WallClockTrusted says whether the device's wall clock may judge a
	// command's deadline (docs/commands.md). Nil means DefaultWallClockTrusted.
	WallClockTrusted func() bool
	// Keep is how long settled commands are kept, measured on the outbox
	// clock: while kept, a command delivered again is recognised and not
	// applied again. Zero means 7 days.
	Keep time.Duration
	// Logger receives the logs. Nil means the Outbox's.
	Logger *slog.Logger
	// OnCommand, if set, is called after each command's outcome is
	// committed (CommandRetry: after its failure is recorded), with the
	// handler's error for CommandRetry and CommandFailed. It must not block.
	OnCommand func(Command, CommandOutcome, error)
}

// Commands applies the commands received, in arrival order, one at a
// time, each in one transaction with its answer: see Run.
type Commands struct {
	ob      *Outbox
	h       CommandHandler
	opts    CommandOptions
	log     *slog.Logger
	running atomic.Bool
	// poll is how often Run looks again while it waits: for a trusted
	// clock, for another process's commit (data_version), for the sweeps.
	poll time.Duration
}

// Defaults of CommandOptions.
const (
	defaultCommandAttempts = 5
	defaultCommandKeep     = 7 * 24 * time.Hour
)

// How often Run sweeps expired waiting commands and purges settled ones,
// and how often it looks for another process's commit while idle.
const (
	commandSweepEvery = time.Second
	commandPurgeEvery = time.Minute
	commandIdlePoll   = 100 * time.Millisecond
)

// NewCommands returns the applier of this Outbox's commands with h. Run
// runs it; commands are stored by a transport's receiver
// (NewMQTTCommandReceiver, or StoreCommand).
func (o *Outbox) NewCommands(h CommandHandler, opts CommandOptions) (*Commands, error) {
	if h == nil {
		return nil, errors.New("outbox: NewCommands: nil handler")
	}
	if o.readOnly {
		return nil, ErrReadOnly
	}
	if opts.MaxAttempts < 0 || opts.Keep < 0 {
		return nil, fmt.Errorf("outbox: NewCommands: negative MaxAttempts or Keep")
	}
	if opts.MaxAttempts == 0 {
		opts.MaxAttempts = defaultCommandAttempts
	}
	if opts.RetryBackoff.Initial == 0 {
		opts.RetryBackoff.Initial = time.Second
	}
	if opts.RetryBackoff.Max == 0 {
		opts.RetryBackoff.Max = time.Minute
	}
	if opts.WallClockTrusted == nil {
		opts.WallClockTrusted = DefaultWallClockTrusted
	}
	if opts.Keep == 0 {
		opts.Keep = defaultCommandKeep
	}
	if opts.Logger == nil {
		opts.Logger = o.log
	}
	return &Commands{ob: o, h: h, opts: opts, log: opts.Logger, poll: commandSweepEvery}, nil
}

// Run applies waiting commands in arrival order until ctx ends or the
// Outbox is closed, and returns nil; one Run at a time. For each command, in one
// transaction: its expiry is judged on the outbox clock (past it, it is
// settled as expired and answered, and the handler is not called); else the
// handler runs, and the command is settled as applied and answered. A
// handler's error rolls back, counts an attempt and holds the command (and
// the ones behind it: order) for RetryBackoff; at MaxAttempts it is
// settled as failed and answered with the error's text. A command whose
// deadline waits for a trusted wall clock holds the ones behind it too.
// Another process may settle a command meanwhile: it is then not applied
// here. Run also expires waiting commands (ExpireCommands) and deletes
// settled ones older than Keep.
func (c *Commands) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("outbox: Commands.Run is already running")
	}
	defer c.running.Store(false)
	var lastSweep, lastPurge time.Time
	var hold struct {
		seq   int64
		until time.Time
	}
	trouble := 0 // failures of the database in a row, not the handler's
	for {
		if ctx.Err() != nil || c.ob.isClosed() {
			return nil
		}
		wake := c.ob.commandWake.wait()
		if time.Since(lastPurge) >= commandPurgeEvery {
			lastPurge = time.Now()
			if _, err := c.ob.purgeCommands(ctx, c.opts.Keep); err != nil && ctx.Err() == nil {
				c.log.Warn("outbox: purging settled commands", "err", err)
			}
		}
		if time.Since(lastSweep) >= c.poll {
			lastSweep = time.Now()
			if _, err := c.ob.ExpireCommands(ctx, c.opts.WallClockTrusted); err != nil && ctx.Err() == nil {
				c.log.Warn("outbox: expiring commands", "err", err)
			}
		}
		cmd, ok, err := c.ob.nextCommand(ctx)
		if err == nil && !ok {
			c.idle(ctx, wake)
			continue
		}
		if err == nil && cmd.Seq == hold.seq && time.Now().Before(hold.until) {
			c.sleep(ctx, wake, time.Until(hold.until))
			continue
		}
		var wait bool
		if err == nil {
			wait, err = c.step(ctx, cmd, &hold.seq, &hold.until)
		}
		if err != nil {
			if ctx.Err() != nil || c.ob.isClosed() {
				return nil
			}
			trouble++
			d := retryDelay(c.opts.RetryBackoff, trouble)
			c.log.Warn("outbox: applying commands", "err", err, "retry_in", d)
			c.sleep(ctx, wake, d)
			continue
		}
		trouble = 0
		if wait {
			c.sleep(ctx, wake, c.poll)
		}
	}
}

// step settles cmd, the oldest waiting command, in one transaction: its
// expiry judged, then (in time) the handler, the state and the answer; or
// says to wait (for a trusted clock). A handler's failure sets hold.
func (c *Commands) step(ctx context.Context, cmd waitingCommand, holdSeq *int64, holdUntil *time.Time) (wait bool, err error) {
	o := c.ob
	var herr error
	var v verdict
	err = runTx(ctx, o.db, func(tx *sql.Tx) error {
		herr = nil
		clk, err := o.clockIn(ctx, tx, false)
		if err != nil {
			return err
		}
		v = judge(&cmd, clk, o.now(), c.opts.WallClockTrusted)
		switch v.outcome {
		case verdictWait:
			return nil // nothing written
		case verdictExpire:
			settled, err := o.settleIn(ctx, tx, cmd.answerTo(), cmd.Seq, CommandExpired, v.reason, nil)
			if err == nil && !settled {
				return errSettled
			}
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE outbox_command SET state = 'applied', done_at = ?, reason = NULL
			WHERE seq = ? AND state = 'received'`, o.now().UnixMilli(), cmd.Seq)
		if err != nil {
			return fmt.Errorf("outbox: apply command: %w", classifyWriteErr(err))
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return errSettled
		}
		result, err := c.h(ctx, tx, cmd.Command)
		switch {
		case err != nil:
			herr = err
		case result != nil && !validJSON(result):
			herr = errors.New("the handler's result is not one JSON value")
		}
		if herr != nil {
			return herr
		}
		err = o.enqueueAnswer(ctx, tx, cmd.answerTo(), CommandApplied, "", result)
		if errors.Is(err, ErrPayloadTooLarge) {
			herr = fmt.Errorf("the answer is over the payload limit: %w", err)
			return herr
		}
		return err
	})
	switch {
	case errors.Is(err, errSettled):
		return false, nil
	case herr != nil && errors.Is(err, herr):
		return false, c.failed(ctx, cmd, herr, holdSeq, holdUntil)
	case err != nil:
		return false, err
	case v.outcome == verdictWait:
		return true, nil
	}
	if cmd.ResponseTopic != "" {
		o.wake.notify()
	}
	if v.outcome == verdictExpire {
		c.log.Warn("outbox: command expired, not applied", "seq", cmd.Seq, "id", cmd.ID, "source", cmd.Source, "reason", v.reason)
		c.done(cmd.Command, CommandExpired, nil)
		return false, nil
	}
	c.log.Debug("outbox: command applied", "seq", cmd.Seq, "id", cmd.ID, "source", cmd.Source)
	c.done(cmd.Command, CommandApplied, nil)
	return false, nil
}

// failed records a handler's failure of cmd: an attempt more, and the
// command held for RetryBackoff, or at MaxAttempts settled as failed.
func (c *Commands) failed(ctx context.Context, cmd waitingCommand, herr error, holdSeq *int64, holdUntil *time.Time) error {
	o := c.ob
	reason := boundReason(herr.Error())
	var attempts int
	var quarantined bool
	err := runTx(ctx, o.db, func(tx *sql.Tx) error {
		quarantined = false
		err := tx.QueryRowContext(ctx, `UPDATE outbox_command SET attempts = attempts + 1, reason = ?
			WHERE seq = ? AND state = 'received' RETURNING attempts`, reason, cmd.Seq).Scan(&attempts)
		if errors.Is(err, sql.ErrNoRows) {
			return errSettled
		}
		if err != nil {
			return fmt.Errorf("outbox: command: %w", classifyWriteErr(err))
		}
		if attempts < c.opts.MaxAttempts {
			return nil
		}
		quarantined = true
		_, err = o.settleIn(ctx, tx, cmd.answerTo(), cmd.Seq, CommandFailed, reason, nil)
		return err
	})
	if errors.Is(err, errSettled) {
		return nil
	}
	if err != nil {
		return err
	}
	cmd.Attempts = attempts
	if quarantined {
		if cmd.ResponseTopic != "" {
			o.wake.notify()
		}
		c.log.Warn("outbox: command failed, quarantined", "seq", cmd.Seq, "id", cmd.ID, "source", cmd.Source, "attempts", attempts, "err", herr)
		c.done(cmd.Command, CommandFailed, herr)
		return nil
	}
	*holdSeq, *holdUntil = cmd.Seq, time.Now().Add(retryDelay(c.opts.RetryBackoff, attempts))
	c.log.Info("outbox: command failed, to be tried again", "seq", cmd.Seq, "id", cmd.ID, "attempts", attempts, "err", herr)
	c.done(cmd.Command, CommandRetry, herr)
	return nil
}

func (c *Commands) done(cmd Command, out CommandOutcome, err error) {
	if c.opts.OnCommand != nil {
		c.opts.OnCommand(cmd, out, err)
	}
}

// sleep waits d, or less: until a command is stored in this process, or ctx
// ends.
func (c *Commands) sleep(ctx context.Context, wake <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-wake:
	case <-t.C:
	}
}

// idle waits, with nothing to apply, until a command may have been stored:
// by this process (wake), or by another (the data_version of one
// connection changes), or until the next sweep is due.
func (c *Commands) idle(ctx context.Context, wake <-chan struct{}) {
	conn, err := c.ob.db.Conn(ctx)
	if err != nil {
		c.sleep(ctx, wake, c.poll)
		return
	}
	defer conn.Close()
	version := func() (int64, bool) {
		var v int64
		err := conn.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&v)
		return v, err == nil
	}
	v0, ok := version()
	if !ok {
		c.sleep(ctx, wake, c.poll)
		return
	}
	// Looked at again after data_version is read: a command stored
	// between Run's look and here is not waited past.
	var waiting bool
	if err := conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_command WHERE state = 'received')`).Scan(&waiting); err != nil || waiting {
		return
	}
	tick := time.NewTicker(commandIdlePoll)
	defer tick.Stop()
	end := time.NewTimer(c.poll)
	defer end.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
			return
		case <-end.C:
			return
		case <-tick.C:
			if v, ok := version(); !ok || v != v0 {
				return
			}
		}
	}
}

// waitingCommand is a command waiting to be applied, with what its expiry
// is judged by.
type waitingCommand struct {
	Command
	receivedClock int64
	expires       sql.NullInt64 // outbox clock
	sentAt        sql.NullInt64 // Unix ms, the sender's clock
	deadline      sql.NullInt64 // Unix ms, the sender's clock
}

func (w *waitingCommand) answerTo() answerTo {
	return answerTo{id: w.ID, source: w.Source, topic: w.ResponseTopic, correlation: w.CorrelationData}
}

// nextCommand reads the oldest waiting command. A row is read as the
// receiver wrote it, but bounded as untrusted all the same: data over the
// payload limit is not read (the command fails at its turn).
func (o *Outbox) nextCommand(ctx context.Context) (w waitingCommand, ok bool, err error) {
	var rt sql.NullString
	var dataLen int64
	var data []byte
	err = o.db.QueryRowContext(ctx, `SELECT seq, id, source, type, content_type, topic,
			CASE WHEN octet_length(data) > ? THEN NULL ELSE data END, octet_length(data),
			response_topic, correlation_data, attempts, received_clock_ms, expires_at, sent_at, deadline
		FROM outbox_command WHERE state = 'received' ORDER BY seq LIMIT 1`, o.maxPayload).Scan(
		&w.Seq, &w.ID, &w.Source, &w.Type, &w.DataContentType, &w.Topic, &data, &dataLen,
		&rt, &w.CorrelationData, &w.Attempts, &w.receivedClock, &w.expires, &w.sentAt, &w.deadline)
	if errors.Is(err, sql.ErrNoRows) {
		return waitingCommand{}, false, nil
	}
	if err != nil {
		return waitingCommand{}, false, fmt.Errorf("outbox: reading commands: %w", err)
	}
	w.Data = data
	if w.Data == nil {
		w.Data = []byte{}
	}
	if rt.Valid && ValidateTopic(rt.String) == nil && strings.HasPrefix(rt.String, o.prefix) {
		w.ResponseTopic = rt.String
	}
	if len(w.CorrelationData) > maxBinaryBytes {
		w.CorrelationData = nil
	}
	if w.sentAt.Valid {
		w.Time = time.UnixMilli(w.sentAt.Int64)
	}
	if w.deadline.Valid {
		w.Deadline = time.UnixMilli(w.deadline.Int64)
	}
	return w, true, nil
}

// A verdict on a waiting command.
type verdict struct {
	outcome int
	reason  string
}

const (
	verdictApply = iota
	verdictExpire
	verdictWait
)

// judge applies docs/commands.md's rules to a waiting command at clk on
// the outbox clock: past its expiry it expires; a deadline not judged at
// receipt is judged now if the wall clock (now) is trusted, else the
// command expires once its lifetime (deadline - sent_at, both the sender's
// clock) has passed on the outbox clock since receipt, and waits until
// then.
func judge(w *waitingCommand, clk int64, now time.Time, trusted func() bool) verdict {
	if w.expires.Valid {
		if clk >= w.expires.Int64 {
			return verdict{verdictExpire, "its time ran out before its turn"}
		}
		return verdict{outcome: verdictApply}
	}
	if !w.deadline.Valid {
		return verdict{outcome: verdictApply}
	}
	if trusted() {
		if clk+(w.deadline.Int64-now.UnixMilli()) <= clk {
			return verdict{verdictExpire, "its deadline has passed (by the device's clock, trusted since it arrived)"}
		}
		return verdict{outcome: verdictApply}
	}
	if w.sentAt.Valid && clk-w.receivedClock >= w.deadline.Int64-w.sentAt.Int64 {
		return verdict{verdictExpire, "its lifetime passed while the device's clock was not trusted"}
	}
	return verdict{outcome: verdictWait}
}

// ExpireCommands settles, as expired (with their answers), the waiting
// commands whose expiry has passed on the outbox clock, and those waiting
// for a trusted clock whose lifetime has passed; trusted says whether the
// wall clock may judge a deadline now (nil: DefaultWallClockTrusted), and if
// it may, the commands waiting for it get their expiry. It returns how many
// it expired. A receiver calls it now and then so that stale commands are
// answered even where no Commands runs.
func (o *Outbox) ExpireCommands(ctx context.Context, trusted func() bool) (int64, error) {
	if o.isClosed() {
		return 0, ErrClosed
	}
	if o.readOnly {
		return 0, ErrReadOnly
	}
	if trusted == nil {
		trusted = DefaultWallClockTrusted
	}
	var waiting bool
	if err := o.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_command WHERE state = 'received')`).Scan(&waiting); err != nil {
		return 0, fmt.Errorf("outbox: expiring commands: %w", err)
	}
	if !waiting {
		return 0, nil // nothing to write: the common case
	}
	var n int64
	answered := false
	err := runTx(ctx, o.db, func(tx *sql.Tx) error {
		n, answered = 0, false
		clk, err := o.clockIn(ctx, tx, false)
		if err != nil {
			return err
		}
		var unjudged bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_command
			WHERE state = 'received' AND expires_at IS NULL AND deadline IS NOT NULL)`).Scan(&unjudged); err != nil {
			return err
		}
		if unjudged && trusted() {
			// Rule 2 with the wall clock of this moment, once: from here
			// on only the outbox clock counts.
			if _, err := tx.ExecContext(ctx, `UPDATE outbox_command SET expires_at = ?1 + deadline - ?2, reason = NULL
				WHERE state = 'received' AND expires_at IS NULL AND deadline IS NOT NULL`, clk, o.now().UnixMilli()); err != nil {
				return fmt.Errorf("outbox: expiring commands: %w", classifyWriteErr(err))
			}
		}
		rows, err := tx.QueryContext(ctx, `SELECT seq, id, source, response_topic, correlation_data, expires_at IS NOT NULL
			FROM outbox_command WHERE state = 'received' AND (expires_at <= ?1
				OR (expires_at IS NULL AND deadline IS NOT NULL AND sent_at IS NOT NULL AND ?1 - received_clock_ms >= deadline - sent_at))
			ORDER BY seq LIMIT ?2`, clk, txn.BatchRows)
		if err != nil {
			return err
		}
		type expiring struct {
			seq    int64
			to     answerTo
			timely bool
		}
		var list []expiring
		for rows.Next() {
			var e expiring
			var rt sql.NullString
			if err := rows.Scan(&e.seq, &e.to.id, &e.to.source, &rt, &e.to.correlation, &e.timely); err != nil {
				rows.Close()
				return err
			}
			if rt.Valid && ValidateTopic(rt.String) == nil && strings.HasPrefix(rt.String, o.prefix) {
				e.to.topic = rt.String
			}
			list = append(list, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, e := range list {
			reason := "its time ran out before its turn"
			if !e.timely {
				reason = "its lifetime passed while the device's clock was not trusted"
			}
			settled, err := o.settleIn(ctx, tx, e.to, e.seq, CommandExpired, reason, nil)
			if err != nil {
				return err
			}
			if settled {
				n++
				answered = answered || e.to.topic != ""
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if answered {
		o.wake.notify()
	}
	return n, nil
}

// settleIn settles a waiting command as out in tx, with its answer: the
// UPDATE changes the row only while it waits, so a command another process
// settled is left as it is (false).
func (o *Outbox) settleIn(ctx context.Context, tx *sql.Tx, to answerTo, seq int64, out CommandOutcome, reason string, result []byte) (bool, error) {
	res, err := tx.ExecContext(ctx, `UPDATE outbox_command SET state = ?, reason = ?, done_at = ?
		WHERE seq = ? AND state = 'received'`, string(out), sql.NullString{String: reason, Valid: reason != ""}, o.now().UnixMilli(), seq)
	if err != nil {
		return false, fmt.Errorf("outbox: settle command: %w", classifyWriteErr(err))
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return false, err
	}
	return true, o.enqueueAnswer(ctx, tx, to, out, reason, result)
}

// answerTo is where a command's answer goes, and what it names.
type answerTo struct {
	id, source  string
	topic       string // "" or NULL: no answer
	correlation []byte
}

// AnswerEventType is the CloudEvents type of a command's answer.
const AnswerEventType = "outbox.command.answer"

// enqueueAnswer enqueues a command's answer in tx, if it has an answer
// topic: {"command","source","status","reason","result"}, the reason only
// when not applied, the result (the handler's JSON) only when applied and
// given, at MaxPriority so that it does not wait behind a backlog.
func (o *Outbox) enqueueAnswer(ctx context.Context, tx *sql.Tx, to answerTo, out CommandOutcome, reason string, result []byte) error {
	if to.topic == "" {
		return nil
	}
	err := o.Enqueue(ctx, tx, Message{Topic: to.topic, Payload: answerPayload(to.id, to.source, out, reason, result),
		Type: AnswerEventType, ContentType: "application/json", Priority: MaxPriority, CorrelationData: to.correlation})
	if errors.Is(err, ErrPayloadTooLarge) && out != CommandApplied {
		// A payload limit set below an answer's few hundred bytes: the
		// command is settled all the same, unanswered, rather than
		// never (the handler's result is the caller's to bound).
		o.log.Warn("outbox: a command's answer is over the payload limit; not sent", "id", to.id, "source", to.source, "status", string(out))
		return nil
	}
	return err
}

// answerPayload is an answer's JSON.
func answerPayload(id, source string, out CommandOutcome, reason string, result []byte) []byte {
	b := make([]byte, 0, 64+len(id)+len(source)+len(reason)+len(result))
	b = append(b, `{"command":`...)
	b = appendJSONString(b, strings.ToValidUTF8(id, "\uFFFD"))
	b = append(b, `,"source":`...)
	b = appendJSONString(b, strings.ToValidUTF8(source, "\uFFFD"))
	b = append(b, `,"status":`...)
	b = appendJSONString(b, string(out))
	if out != CommandApplied {
		b = append(b, `,"reason":`...)
		b = appendJSONString(b, strings.ToValidUTF8(reason, "\uFFFD"))
	} else if result != nil {
		b = append(b, `,"result":`...)
		b = append(b, result...)
	}
	return append(b, '}')
}

// maxReasonBytes bounds a reason stored and sent: a handler's error text
// goes to the sender.
const maxReasonBytes = 1024

// boundReason is s cut to maxReasonBytes, at a character's start, as
// valid UTF-8.
func boundReason(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxReasonBytes {
		return s
	}
	cut := maxReasonBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// purgeCommands deletes the settled commands received longer than keep ago
// on the outbox clock; waiting ones are never deleted. Kept, a command
// delivered again is known for what it is.
func (o *Outbox) purgeCommands(ctx context.Context, keep time.Duration) (int64, error) {
	clk := o.commandClock.Now()
	return txn.InBatches(ctx, o.db, `DELETE FROM outbox_command WHERE seq IN (SELECT seq FROM outbox_command
		WHERE state <> 'received' AND received_clock_ms < ? LIMIT ?)`, clk-keep.Milliseconds(), txn.BatchRows)
}

// readCommandStats counts the commands by state; a file of a schema before
// commands has none.
func readCommandStats(ctx context.Context, q querier, schema int, s *CommandStats) error {
	if schema < 10 {
		return nil
	}
	rows, err := q.QueryContext(ctx, `SELECT state, count(*) FROM outbox_command GROUP BY state`)
	if err != nil {
		return fmt.Errorf("outbox: command stats: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var state string
		var n int64
		if err := rows.Scan(&state, &n); err != nil {
			return fmt.Errorf("outbox: command stats: %w", err)
		}
		switch state {
		case stateReceived:
			s.Waiting = n
		case string(CommandApplied):
			s.Applied = n
		case string(CommandExpired):
			s.Expired = n
		case string(CommandFailed):
			s.Failed = n
		case string(CommandMalformed):
			s.Malformed = n
		}
	}
	return rows.Err()
}

// CommandStats counts the commands received, by state.
type CommandStats struct {
	// Waiting have not been settled yet (state 'received').
	Waiting int64
	// Applied, Expired, Failed and Malformed are settled and kept
	// (CommandOptions.Keep).
	Applied, Expired, Failed, Malformed int64
}
