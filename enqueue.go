package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Message is one event to publish.
type Message struct {
	// Topic is the MQTT topic. Required.
	Topic string
	// Payload is published as the event's data. It may be empty.
	Payload []byte
	// Type is the CloudEvents type, e.g. "com.example.order.created".
	// Empty means the relay's default type.
	Type string
	// ContentType is the CloudEvents datacontenttype. Empty means
	// application/json when Payload is valid JSON, else
	// application/octet-stream.
	ContentType string
	// ID is the event's unique id. Empty means a new id from NewID.
	ID string
	// Expiry, if positive, is how long the message may wait to be
	// published: a message whose expiry ran out before its turn is parked
	// as expired (StateExpired), not published, and under MQTT 5 the broker
	// is given what is left as the Message Expiry Interval. It is measured
	// on the outbox clock — time during which an outbox ran on this
	// database, by the monotonic clock — so a wall-clock jump cannot expire
	// a backlog, and time the device was off does not count. Zero means
	// none; negative is refused with ErrInvalidMessage.
	Expiry time.Duration
	// Priority is 0 (the default) to MaxPriority, higher first: the relay
	// publishes the highest priority pending first, and each priority in
	// commit order; across priorities, commit order does not hold. Out of
	// range is refused with ErrInvalidMessage.
	Priority int
	// CorrelationData is published as MQTT 5's Correlation Data and, in
	// either CloudEvents mode, as the extension correlationdata (base64):
	// an answer to a request carries the request's. At most 65,535 bytes
	// (MQTT's binary data), else refused with ErrInvalidMessage; nil means
	// none.
	CorrelationData []byte
}

// Enqueue writes msgs into the outbox inside tx, the caller's transaction:
// they are published only if tx commits. All messages are validated before
// anything is written. On ErrFull or ErrDiskFull the caller must roll tx
// back.
//
// tx must come from the *sql.DB this Outbox was created on; a transaction of
// another database is refused.
func (o *Outbox) Enqueue(ctx context.Context, tx *sql.Tx, msgs ...Message) error {
	if tx == nil {
		return ErrNilTx
	}
	if err := o.validate(msgs); err != nil {
		return err
	}
	o.inUse.RLock()
	defer o.inUse.RUnlock()
	if o.isClosed() {
		return ErrClosed
	}
	if o.readOnly {
		return ErrReadOnly
	}
	// The statements are prepared once per connection: preparing an
	// INSERT that fires the schema's triggers costs more than running it.
	var stmts [len(insertSQLs)]*sql.Stmt
	defer func() {
		for _, st := range stmts {
			if st != nil {
				st.Close()
			}
		}
	}()
	now := o.now()
	created := now.UnixMilli()
	tick, storeClock := o.clock.Due()
	expiring := false
	var first int64 // the first message's seq, for durable.Commits
	for i := range msgs {
		m := &msgs[i]
		id := m.ID
		if id == "" {
			id = newIDAt(now)
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{} // NOT NULL: an empty payload is a valid event
		}
		life := expiryMillis(m.Expiry)
		k := insertPlain
		switch {
		case len(m.CorrelationData) > 0:
			k = insertCorrelated
		case m.Priority > 0:
			k = insertPriority
		case life > 0:
			k = insertExpiring
		case m.ContentType == "":
			k = insertNoContentType
		}
		if stmts[k] == nil {
			stmts[k] = tx.StmtContext(ctx, o.insert[k])
		}
		var res sql.Result
		var err error
		switch k {
		case insertExpiring:
			expiring = true
			res, err = stmts[k].ExecContext(ctx, id, m.Topic, payload, m.Type, m.ContentType, created, tick, life)
		case insertNoContentType:
			res, err = stmts[k].ExecContext(ctx, id, m.Topic, payload, m.Type, created)
		case insertPriority:
			expiring = expiring || life > 0
			res, err = stmts[k].ExecContext(ctx, id, m.Topic, payload, m.Type, m.ContentType, created, tick, life, m.Priority)
		case insertCorrelated:
			expiring = expiring || life > 0
			res, err = stmts[k].ExecContext(ctx, id, m.Topic, payload, m.Type, m.ContentType, created, tick, life, m.Priority, m.CorrelationData)
		default:
			res, err = stmts[k].ExecContext(ctx, id, m.Topic, payload, m.Type, m.ContentType, created)
		}
		if err != nil {
			return fmt.Errorf("outbox: enqueue: %w", classifyWriteErr(err))
		}
		if o.durable.Full && (i == 0 || i == len(msgs)-1) {
			if seq, err := res.LastInsertId(); err == nil {
				if i == 0 {
					first = seq
				}
				if i == len(msgs)-1 {
					o.durable.Enqueued(tx, first, seq, id)
				}
			}
		}
	}
	if expiring && storeClock {
		// Another process (a relay sidecar) measures this message's expiry
		// from the stored clock: keep it close to this one's.
		if _, err := tx.ExecContext(ctx, `UPDATE outbox_state SET clock_ms = max(clock_ms, ?) WHERE id = 1`, tick); err != nil {
			return fmt.Errorf("outbox: enqueue: %w", classifyWriteErr(err))
		}
		o.clock.CatchUp(tick)
	}
	return nil
}

// The library's inserts, one for each shape of message: each parameter the
// driver binds, and each expression SQLite evaluates, is paid on every row,
// so a message binds only what it has (an empty content type is the
// column's default).
const (
	insertPlain = iota
	insertNoContentType
	insertExpiring
	insertPriority
	insertCorrelated
)

var insertSQLs = [...]string{
	insertPlain:         `INSERT INTO outbox (id, topic, payload, type, content_type, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
	insertNoContentType: `INSERT INTO outbox (id, topic, payload, type, created_at) VALUES (?, ?, ?, ?, ?)`,
	// An expiry runs from the later of this Outbox's clock and the stored
	// one: a clock that lags another process's must not shorten it.
	insertExpiring: `INSERT INTO outbox (id, topic, payload, type, content_type, created_at, expires_at)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, max(?7, (SELECT clock_ms FROM outbox_state WHERE id = 1)) + ?8)`,
	// A priority above 0, with or without an expiry (?8 = 0: none): rare
	// enough that one statement binds everything.
	insertPriority: `INSERT INTO outbox (id, topic, payload, type, content_type, created_at, expires_at, priority)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?8 > 0 THEN max(?7, (SELECT clock_ms FROM outbox_state WHERE id = 1)) + ?8 END, ?9)`,
	// Correlation Data (an answer to a command): rarer still, so the
	// statements above stay as they are for every other message.
	insertCorrelated: `INSERT INTO outbox (id, topic, payload, type, content_type, created_at, expires_at, priority, correlation_data)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?8 > 0 THEN max(?7, (SELECT clock_ms FROM outbox_state WHERE id = 1)) + ?8 END, ?9, ?10)`,
}

// inserts are insertSQLs prepared on an Outbox's database.
type inserts [len(insertSQLs)]*sql.Stmt

// prepareInserts prepares insertSQLs on db.
func prepareInserts(ctx context.Context, db *sql.DB) (*inserts, error) {
	var s inserts
	for k, q := range insertSQLs {
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			s.close()
			return nil, err
		}
		s[k] = st
	}
	return &s, nil
}

func (s *inserts) close() {
	for _, st := range s {
		if st != nil {
			st.Close()
		}
	}
}

// validate checks every message before anything is written.
func (o *Outbox) validate(msgs []Message) error {
	for i := range msgs {
		m := &msgs[i]
		if err := ValidateTopic(m.Topic); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		if !strings.HasPrefix(m.Topic, o.prefix) {
			return fmt.Errorf("message %d: %w: %q is not under %q", i, ErrTopicOutsidePrefix, m.Topic, o.prefix)
		}
		if len(m.Payload) > o.maxPayload {
			return fmt.Errorf("message %d: %w: %d bytes, limit %d", i, ErrPayloadTooLarge, len(m.Payload), o.maxPayload)
		}
		if m.ID != "" && (len(m.ID) > MaxIDBytes || !utf8.ValidString(m.ID)) {
			return fmt.Errorf("message %d: %w: id must be valid UTF-8 of at most %d bytes", i, ErrInvalidMessage, MaxIDBytes)
		}
		if m.Expiry < 0 {
			return fmt.Errorf("message %d: %w: negative Expiry %s", i, ErrInvalidMessage, m.Expiry)
		}
		if m.Priority < 0 || m.Priority > MaxPriority {
			return fmt.Errorf("message %d: %w: Priority %d outside 0..%d", i, ErrInvalidMessage, m.Priority, MaxPriority)
		}
		if len(m.CorrelationData) > maxBinaryBytes {
			return fmt.Errorf("message %d: %w: CorrelationData of %d bytes, over MQTT's %d", i, ErrInvalidMessage, len(m.CorrelationData), maxBinaryBytes)
		}
		if len(m.Type) > maxTypeBytes || !utf8.ValidString(m.Type) || len(m.ContentType) > maxTypeBytes || !utf8.ValidString(m.ContentType) {
			return fmt.Errorf("message %d: %w: type and content type must be valid UTF-8 of at most %d bytes", i, ErrInvalidMessage, maxTypeBytes)
		}
	}
	return nil
}

// ValidateTopic reports whether topic can be published over any transport:
// non-empty, valid UTF-8, no NUL, no other control character and no
// Unicode noncharacter, no wildcard, not beginning with '$', at most 65,535
// bytes. The schema refuses the same at INSERT, for every writer. The
// errors match ErrInvalidTopic.
func ValidateTopic(topic string) error {
	switch {
	case topic == "":
		return ErrTopicEmpty
	case len(topic) > maxTopicBytes:
		return ErrTopicTooLong
	case strings.ContainsAny(topic, "+#"):
		return ErrTopicWildcard
	case strings.IndexByte(topic, 0) >= 0:
		return ErrTopicNUL
	case !utf8.ValidString(topic):
		return ErrTopicNotUTF8
	case topic[0] == '$':
		return ErrTopicReserved
	case hasControl(topic):
		return ErrTopicControl
	}
	return nil
}

// hasControl reports whether s, valid UTF-8, holds a control character
// (C0 but NUL, DEL, C1) or a Unicode noncharacter: what the MQTT spec says
// a topic should not hold [MQTT-1.5.4], and what the schema's GLOB refuses.
func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return true
		} else if c >= utf8.RuneSelf {
			return hasControlRune(s[i:])
		}
	}
	return false
}

func hasControlRune(s string) bool {
	for _, r := range s {
		switch {
		case r < 0x20, r >= 0x7f && r <= 0x9f,
			r >= 0xfdd0 && r <= 0xfdef, r&0xfffe == 0xfffe:
			return true
		}
	}
	return false
}

// validatePrefix checks a TopicPrefix: a topic may start with it.
func validatePrefix(prefix string) error {
	if err := ValidateTopic(prefix); err != nil {
		return fmt.Errorf("outbox: TopicPrefix %q: %w", prefix, err)
	}
	return nil
}

// Transact runs fn in a write transaction, commits it and wakes the relay.
// When SQLite reports the database busy (another writer held the lock past
// the busy timeout, or a read snapshot went stale), the transaction is rolled
// back and fn runs again, a few times, with a short random pause: fn must
// not have effects outside tx. Any other error from fn rolls back and is
// returned as is. A Transact that Close interrupts fails with an error that
// matches ErrClosed.
func (o *Outbox) Transact(ctx context.Context, fn func(tx *sql.Tx) error) error {
	if o.isClosed() {
		return ErrClosed
	}
	if o.readOnly {
		return ErrReadOnly
	}
	call(o.hooks.beforeTx)
	// Each attempt's transaction is noted, so that Enqueue tells it the
	// seqs it inserted: once COMMIT returns at FULL, they are durable, and
	// the relay need not sync before publishing them (durable.Commits).
	var last *sql.Tx
	err := runTx(ctx, o.db, func(tx *sql.Tx) error {
		o.durable.End(last, false)
		last = tx
		o.durable.Begin(tx)
		return fn(tx)
	})
	if err == nil {
		call(o.hooks.afterCommit)
	}
	o.durable.End(last, err == nil)
	if err != nil {
		if o.isClosed() && !errors.Is(err, ErrClosed) {
			// database/sql's own errors once Open's database is closed
			// ("sql: database is closed") say the same, less clearly.
			return fmt.Errorf("%w: %w", ErrClosed, err)
		}
		return err
	}
	o.wake.notify()
	return nil
}

// Notify wakes the relays of this Outbox at once. Transact calls it after
// every commit; call it after committing a transaction of your own that
// called Enqueue, or rely on the relay noticing the commit within its poll
// interval.
func (o *Outbox) Notify() { o.wake.notify() }

// notifier wakes every waiter at once: wait returns a channel that the next
// notify closes.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func (n *notifier) wait() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

func (n *notifier) notify() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}
