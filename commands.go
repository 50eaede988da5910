package outbox

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"time"
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
// not commit or roll tx back, nor have effects outside tx.
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
	ob   *Outbox
	h    CommandHandler
	opts CommandOptions
	log  *slog.Logger
}

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
	if opts.Logger == nil {
		opts.Logger = o.log
	}
	return &Commands{ob: o, h: h, opts: opts, log: opts.Logger}, nil
}

// Run applies waiting commands in arrival order until ctx ends, then
// returns ctx's error.
func (c *Commands) Run(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

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
// nil error. trusted says whether the wall clock may judge the envelope's
// deadline now (nil: DefaultWallClockTrusted).
func (o *Outbox) StoreCommand(ctx context.Context, in IncomingCommand, trusted func() bool) (stored bool, err error) {
	return false, errors.New("outbox: StoreCommand: not yet")
}

// ExpireCommands settles, as expired (with their answers), the waiting
// commands whose expiry has passed on the outbox clock, and those waiting
// for a trusted clock whose lifetime has passed; trusted says whether the
// wall clock may judge a deadline now (nil: DefaultWallClockTrusted). It
// returns how many it expired. A receiver calls it now and then so that
// stale commands are answered even where no Commands runs.
func (o *Outbox) ExpireCommands(ctx context.Context, trusted func() bool) (int64, error) {
	return 0, nil
}

// CommandStats counts the commands received, by state.
type CommandStats struct {
	// Waiting have not been settled yet (state 'received').
	Waiting int64
	// Applied, Expired, Failed and Malformed are settled and kept
	// (CommandOptions.Keep).
	Applied, Expired, Failed, Malformed int64
}
