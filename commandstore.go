package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/edgeoutbox/outbox/internal/sqlconn"
	"github.com/edgeoutbox/outbox/internal/txn"
)

// IncomingCommand is one command as a transport received it.
type IncomingCommand struct {
	// Topic is the topic it arrived on.
	Topic string
	// Payload, ContentType and User are the message's payload, MQTT 5
	// Content Type and user properties (CloudEvents binary mode); over
	// MQTT 3.1.1 the last two are empty.
	Payload     []byte
	ContentType string
	User        []UserProperty
	// ResponseTopic and CorrelationData are MQTT 5's properties of the
	// same names; they win over the envelope's extensions.
	ResponseTopic   string
	CorrelationData []byte
	// MessageExpiry is MQTT 5's Message Expiry Interval as delivered (what
	// the broker left of it); 0 means none.
	MessageExpiry time.Duration
}

// StoreCommand stores one received command durably, in a transaction of
// its own committed at synchronous=FULL whatever the database's default,
// deduplicated by (source, id): a transport acknowledges the command to
// the broker only after it returns nil. stored is false for a duplicate
// (already stored). A payload that is not a valid command envelope is
// stored as malformed (and answered, if an answer topic is known), with a
// nil error; so is one whose expiry had passed when it arrived, as expired.
// trusted says whether the wall clock may judge the envelope's deadline now
// (nil: DefaultWallClockTrusted).
func (o *Outbox) StoreCommand(ctx context.Context, in IncomingCommand, trusted func() bool) (stored bool, err error) {
	if o.isClosed() {
		return false, ErrClosed
	}
	if o.readOnly {
		return false, ErrReadOnly
	}
	if trusted == nil {
		trusted = DefaultWallClockTrusted
	}
	c := o.decodeCommand(in)
	// Asked only where a deadline needs it, and once: the answer holds for
	// the transaction, whatever the clock does meanwhile.
	trust := c.state == "" && c.deadline.Valid && trusted()
	wall := o.now()
	answered := false
	err = o.fullTx(ctx, func(tx *sql.Tx) error {
		stored, answered = false, false
		if o.hooks.commandTx != nil {
			o.hooks.commandTx(tx)
		}
		clk, err := o.clockIn(ctx, tx, true)
		if err != nil {
			return err
		}
		c.receivedClock = clk
		if c.state == "" {
			c.judgeAtReceipt(clk, wall, in.MessageExpiry, trust)
		}
		var done sql.NullInt64
		if c.state != "" {
			done = sql.NullInt64{Int64: wall.UnixMilli(), Valid: true}
		}
		state := c.state
		if state == "" {
			state = string(stateReceived)
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO outbox_command (id, source, topic, type, content_type, data,
				response_topic, correlation_data, sent_at, deadline, received_at, received_clock_ms, expires_at,
				state, reason, done_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (source, id) DO NOTHING`,
			c.id, c.source, c.topic, c.typ, c.contentType, c.data,
			c.responseTopic, c.correlation, c.sentAt, c.deadline, wall.UnixMilli(), clk, c.expires,
			state, c.reason, done)
		if err != nil {
			return fmt.Errorf("outbox: store command: %w", classifyWriteErr(err))
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err // a duplicate: stored before
		}
		stored = true
		if c.state != "" && c.responseTopic.Valid {
			answered = true
			return o.enqueueAnswer(ctx, tx, c.answerTo(), CommandOutcome(c.state), c.reason.String, nil)
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if stored {
		o.commandWake.notify()
		if c.state != "" {
			o.log.Warn("outbox: command settled on arrival", "state", c.state, "id", c.id, "source", c.source, "topic", c.topic, "reason", c.reason.String)
		}
	}
	if answered {
		o.wake.notify()
	}
	return stored, nil
}

// A command's states, as outbox_command.state says them: received (waiting
// to be applied), then one of the outcomes.
const stateReceived = "received"

// incoming is a command as it will be stored.
type incoming struct {
	id, source, topic, typ, contentType string
	data                                []byte
	responseTopic                       sql.NullString
	correlation                         []byte
	sentAt, deadline, expires           sql.NullInt64
	receivedClock                       int64
	// state is "" for a command to apply; "malformed" or "expired" for one
	// settled on arrival, with reason.
	state  string
	reason sql.NullString
}

func (c *incoming) answerTo() answerTo {
	return answerTo{id: c.id, source: c.source, topic: c.responseTopic.String, correlation: c.correlation}
}

// decodeCommand reads a command envelope: a CloudEvent 1.0 in structured
// mode (any MQTT version) or binary mode (MQTT 5), with the extensions
// deadline, responsetopic and correlationdata; MQTT 5's Response Topic and
// Correlation Data win over the last two. Everything is bounded: the data by
// the payload limit stored in the database, the attributes as Enqueue
// bounds a message's. What does not decode is a malformed command, its raw
// payload kept (within the limit), with a new id.
func (o *Outbox) decodeCommand(in IncomingCommand) incoming {
	c := incoming{topic: in.Topic, data: in.Payload}
	malformed := func(format string, args ...any) incoming {
		m := incoming{id: NewID(), topic: in.Topic, data: in.Payload, state: string(CommandMalformed),
			reason: sql.NullString{String: boundReason(fmt.Sprintf(format, args...)), Valid: true}}
		if len(m.data) > o.maxPayload {
			m.data = []byte{}
		}
		// An answer topic is worth finding even here: the sender then
		// learns that its command will never be applied.
		ext, _ := commandExtensions(in.Payload, in.User)
		m.responseTopic, m.correlation = o.answerAddress(in, ext)
		if !m.responseTopic.Valid {
			m.correlation = nil
		}
		return m
	}
	if len(in.Payload) > o.maxPayload {
		return malformed("payload of %d bytes, over the limit of %d", len(in.Payload), o.maxPayload)
	}
	if len(in.Topic) > maxTopicBytes || !utf8.ValidString(in.Topic) {
		return malformed("the topic it arrived on is not a valid topic")
	}
	p, _, err := decompressed(in.Payload, in.User)
	if err != nil {
		return malformed("content-encoding: %v", err)
	}
	if len(p) > o.maxPayload {
		return malformed("payload of %d bytes once decompressed, over the limit of %d", len(p), o.maxPayload)
	}
	ev, err := decodeEventMQTT(p, in.ContentType, in.User)
	if err != nil {
		return malformed("not a command envelope: %s", strings.TrimPrefix(err.Error(), "outbox: decode event: "))
	}
	ext, err := commandExtensions(p, in.User)
	if err != nil {
		return malformed("not a command envelope: %v", err)
	}
	switch {
	case len(ev.ID) > MaxIDBytes || !utf8.ValidString(ev.ID):
		return malformed("id: not valid UTF-8 of at most %d bytes", MaxIDBytes)
	case len(ev.Source) > maxTypeBytes || !utf8.ValidString(ev.Source),
		len(ev.Type) > maxTypeBytes || !utf8.ValidString(ev.Type),
		len(ev.DataContentType) > maxTypeBytes || !utf8.ValidString(ev.DataContentType):
		return malformed("source, type or datacontenttype: not valid UTF-8 of at most %d bytes", maxTypeBytes)
	case len(ev.Data) > o.maxPayload:
		return malformed("data of %d bytes, over the limit of %d", len(ev.Data), o.maxPayload)
	}
	c.id, c.source, c.typ, c.contentType = ev.ID, ev.Source, ev.Type, ev.DataContentType
	c.data = ev.Data
	if c.data == nil {
		c.data = []byte{}
	}
	if !ev.Time.IsZero() {
		c.sentAt = sql.NullInt64{Int64: ev.Time.UnixMilli(), Valid: true}
	}
	if ext.deadline != "" {
		d, err := time.Parse(time.RFC3339Nano, ext.deadline)
		if err != nil {
			return malformed("deadline: not an RFC 3339 timestamp")
		}
		c.deadline = sql.NullInt64{Int64: d.UnixMilli(), Valid: true}
	}
	c.responseTopic, c.correlation = o.answerAddress(in, ext)
	if !c.responseTopic.Valid && (in.ResponseTopic != "" || ext.responseTopic != "") {
		return malformed("response topic: not a topic this device may publish to")
	}
	return c
}

// answerAddress is where a command's answer goes, MQTT 5's properties
// first: the topic, if it is one this Outbox may publish to, and the
// correlation data (at most 65,535 bytes).
func (o *Outbox) answerAddress(in IncomingCommand, ext commandExt) (sql.NullString, []byte) {
	topic := in.ResponseTopic
	if topic == "" {
		topic = ext.responseTopic
	}
	if topic == "" || ValidateTopic(topic) != nil || !strings.HasPrefix(topic, o.prefix) {
		return sql.NullString{}, nil
	}
	corr := in.CorrelationData
	if len(corr) == 0 && ext.correlation != "" {
		corr, _ = decodeCorrelation(ext.correlation)
	}
	if len(corr) == 0 || len(corr) > maxBinaryBytes {
		corr = nil
	}
	return sql.NullString{String: topic, Valid: true}, corr
}

// commandExt is a command envelope's extensions, as written.
type commandExt struct {
	deadline, responseTopic, correlation string
}

// commandExtensions reads the extensions of a command envelope p: from the
// user properties in binary mode (once each), else from the JSON document.
func commandExtensions(p []byte, user []UserProperty) (commandExt, error) {
	var ext commandExt
	if binaryMode(user) {
		seen := map[string]bool{}
		for _, u := range user {
			var dst *string
			switch u.Key {
			case "deadline":
				dst = &ext.deadline
			case "responsetopic":
				dst = &ext.responseTopic
			case "correlationdata":
				dst = &ext.correlation
			default:
				continue
			}
			if seen[u.Key] {
				return commandExt{}, fmt.Errorf("attribute %q given twice", u.Key)
			}
			seen[u.Key] = true
			*dst = u.Value
		}
		return ext, nil
	}
	var raw struct {
		Deadline      string `json:"deadline"`
		ResponseTopic string `json:"responsetopic"`
		Correlation   string `json:"correlationdata"`
	}
	if err := json.Unmarshal(p, &raw); err != nil {
		return commandExt{}, err
	}
	return commandExt{raw.Deadline, raw.ResponseTopic, raw.Correlation}, nil
}

// judgeAtReceipt sets a command's expiry on the outbox clock (clk at
// receipt), by the rules of docs/commands.md: MQTT 5's Message Expiry
// Interval as delivered, always; the deadline, a wall-clock instant, only
// when the wall clock is trusted (trust); neither: none. A deadline that
// cannot be judged, with no interval, leaves the command waiting for a
// trusted clock. One already past is settled as expired.
func (c *incoming) judgeAtReceipt(clk int64, wall time.Time, interval time.Duration, trust bool) {
	if interval > 0 {
		c.expires = sql.NullInt64{Int64: clk + expiryMillis(interval), Valid: true}
	}
	if c.deadline.Valid {
		switch {
		case trust:
			e := clk + (c.deadline.Int64 - wall.UnixMilli())
			if !c.expires.Valid || e < c.expires.Int64 {
				c.expires = sql.NullInt64{Int64: e, Valid: true}
			}
		case !c.expires.Valid:
			c.reason = sql.NullString{String: reasonWaitingForClock, Valid: true}
		}
	}
	if c.expires.Valid && c.expires.Int64 <= clk {
		c.state = string(CommandExpired)
		c.reason = sql.NullString{String: "its deadline had passed when it arrived", Valid: true}
	}
}

// reasonWaitingForClock is the reason a command waits with: its deadline
// cannot be judged until the wall clock is trusted.
const reasonWaitingForClock = "waiting for a trusted clock"

// clockIn reads the outbox clock inside tx as commands see it
// (Outbox.commandClock, which an idle relay does not pause), caught up with
// the stored one, which it stores too when store is set (a command's times
// are judged by other processes, which start from the stored clock).
func (o *Outbox) clockIn(ctx context.Context, tx *sql.Tx, store bool) (int64, error) {
	if store {
		var stored int64
		err := tx.QueryRowContext(ctx, `UPDATE outbox_state SET clock_ms = max(clock_ms, ?) WHERE id = 1 RETURNING clock_ms`, o.commandClock.Now()).Scan(&stored)
		if err != nil {
			return 0, fmt.Errorf("outbox: the outbox clock: %w", classifyWriteErr(err))
		}
		o.commandClock.CatchUp(stored)
		return stored, nil
	}
	stored, err := readOutboxClock(ctx, tx)
	if err != nil {
		return 0, fmt.Errorf("outbox: the outbox clock: %w", err)
	}
	o.commandClock.CatchUp(stored)
	return o.commandClock.Now(), nil
}

// fullTx runs fn in a transaction committed at synchronous=FULL, on a
// connection of its own: a command is acknowledged to the broker once
// stored, so its COMMIT must reach the disk before, whatever the database's
// default (an application may run at NORMAL, whose commits a power cut may
// take back). internal/durable only knows which commits were at FULL; it
// cannot make one so. synchronous is a setting of the connection, so it is
// set for this transaction and put back before the connection returns to
// the pool (a connection that cannot be put back is discarded).
func (o *Outbox) fullTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	conn, err := o.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	defer conn.Close()
	var was int
	if err := conn.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&was); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	if was < 2 { // OFF or NORMAL; FULL is 2, EXTRA 3
		if _, err := conn.ExecContext(ctx, `PRAGMA synchronous = FULL`); err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
		defer func() {
			if _, err := conn.ExecContext(context.WithoutCancel(ctx), fmt.Sprintf(`PRAGMA synchronous = %d`, was)); err != nil {
				conn.Raw(func(any) error { return driver.ErrBadConn })
			}
		}()
	}
	return txn.Run(ctx, conn, sqlconn.IsBusy, classifyWriteErr, fn)
}

// errSettled: the command was settled meanwhile (by another process).
var errSettled = errors.New("outbox: command settled meanwhile")
