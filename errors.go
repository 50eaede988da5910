package outbox

import "errors"

// The errors callers can test with errors.Is, in one place. An error this
// package returns for one of these reasons is or wraps the sentinel, so that
// its text may add detail (which message, which limit) and a caller's
// errors.Is still holds.

// Errors of Enqueue and Transact, and of the calls that write.
var (
	// ErrInvalidTopic is matched by every topic validation error below.
	ErrInvalidTopic = errors.New("outbox: invalid topic")
	// ErrTopicEmpty: the topic is the empty string.
	ErrTopicEmpty = &topicError{"empty"}
	// ErrTopicWildcard: the topic contains the MQTT wildcard '+' or '#',
	// which may appear only in subscriptions.
	ErrTopicWildcard = &topicError{"contains an MQTT wildcard ('+' or '#')"}
	// ErrTopicNUL: the topic contains the NUL character.
	ErrTopicNUL = &topicError{"contains NUL"}
	// ErrTopicNotUTF8: the topic is not valid UTF-8.
	ErrTopicNotUTF8 = &topicError{"not valid UTF-8"}
	// ErrTopicControl: the topic contains a control character (U+0001 to
	// U+001F, U+007F to U+009F) or a Unicode noncharacter (U+FDD0 to
	// U+FDEF, U+FFFE, U+FFFF and their like in every plane), which MQTT
	// says a client should not send: a broker may close the connection on
	// it, every time.
	ErrTopicControl = &topicError{"contains a control character or a Unicode noncharacter"}
	// ErrTopicReserved: the topic begins with '$', which MQTT reserves for
	// the broker's own topics ($SYS): a broker refuses a publish there.
	ErrTopicReserved = &topicError{"begins with '$', reserved for the broker"}
	// ErrTopicTooLong: the topic is longer than MQTT's 65,535 bytes.
	ErrTopicTooLong = &topicError{"longer than 65535 bytes"}
	// ErrTopicOutsidePrefix: the topic does not start with the configured
	// TopicPrefix (Options or RelayOptions).
	ErrTopicOutsidePrefix = &topicError{"outside this device's topic prefix"}

	// ErrPayloadTooLarge: the payload is over the payload limit stored in
	// the database (Options.MaxPayloadBytes sets it).
	ErrPayloadTooLarge = errors.New("outbox: payload too large")
	// ErrInvalidMessage: a field other than topic or payload is unusable.
	ErrInvalidMessage = errors.New("outbox: invalid message")
	// ErrFull: the pending limit (messages or bytes) is reached. The caller's
	// transaction must roll back; nothing committed was dropped.
	ErrFull = errors.New("outbox: full")
	// ErrDiskFull: SQLite reported SQLITE_FULL. The transaction must roll
	// back; the database is intact.
	ErrDiskFull = errors.New("outbox: disk full")
	// ErrClosed: the Outbox was closed.
	ErrClosed = errors.New("outbox: closed")
	// ErrNilTx: Enqueue was called without a transaction.
	ErrNilTx = errors.New("outbox: nil transaction")
	// ErrReadOnly: the Outbox was opened with Options.ReadOnly, and the call
	// would write.
	ErrReadOnly = errors.New("outbox: opened read-only")
)

// Errors of opening a database and of looking a message up.
var (
	// ErrSchemaTooNew: the database was migrated by a newer version of this
	// library; it is refused rather than downgraded.
	ErrSchemaTooNew = errors.New("outbox: database schema is newer than this code")
	// ErrSchemaTooOld: a read-only Outbox found a schema older than it can
	// read; opening it for writing migrates it.
	ErrSchemaTooOld = errors.New("outbox: database schema is older than this code reads")
	// ErrNoSchema: the database has no outbox schema (returned where
	// creating one would be wrong, e.g. for read-only inspection).
	ErrNoSchema = errors.New("outbox: database has no outbox schema")
	// ErrForeignTable: the database has no outbox schema but a table or
	// view of a name the schema uses (outbox, say): someone else's, which
	// the outbox neither creates its schema over nor reads.
	ErrForeignTable = errors.New("outbox: the database has a table of the outbox's name that is not an outbox's")
	// ErrUnsupportedDB: the *sql.DB lacks a setting the outbox relies on.
	ErrUnsupportedDB = errors.New("outbox: unsupported database setup")
	// ErrNotFound: no message has the given id.
	ErrNotFound = errors.New("outbox: not found")
)

// Errors of the relay and of its Publisher.
var (
	// ErrRejected is wrapped by Publisher errors that blame the message
	// itself (the broker or endpoint refused it), as opposed to the
	// connection (a *Refusal matches it). RelayOptions.Retry decides
	// whether such a message goes again or is parked as dead.
	ErrRejected = errors.New("outbox: message rejected")
	// ErrUndeliverable is wrapped, with ErrRejected, by errors for a
	// message that retrying cannot deliver (under MQTT 5: not authorized,
	// topic name invalid, payload format invalid, packet too large; a row
	// no connection can carry): the default RetryPolicy parks it as dead at
	// once.
	ErrUndeliverable = errors.New("outbox: message undeliverable")
	// ErrNotConnected is wrapped by Publisher errors for a message that was
	// never sent because there was no connection.
	ErrNotConnected = errors.New("outbox: not connected")
	// ErrBrokerUnavailable is wrapped by Publisher errors that say the
	// broker cannot take messages for now for a reason of its own — its
	// state or capacity (busy, over quota, shutting down, the client id
	// taken over) — whatever the message. It is an outage: nothing is
	// charged, no message becomes the suspect, and the relay waits with
	// RelayOptions.Reconnect before it publishes again.
	ErrBrokerUnavailable = errors.New("outbox: the broker is unavailable")
	// ErrStalled is wrapped by Publisher errors for a message whose
	// connection was given up on because it moved no bytes before the
	// message had left: the broker never had it, and nothing is charged.
	ErrStalled = errors.New("outbox: the connection moved no bytes before the message had left")
	// ErrLeaseLost: another relay took over this relay's lease, which happens
	// only when this one failed to renew it for a whole lease period.
	ErrLeaseLost = errors.New("outbox: relay lease lost to another relay")
)

// ErrDuplicate is returned by consumer.Inbox.Apply for an event that was already
// applied: the handler did not run.
var ErrDuplicate = errors.New("outbox: duplicate event")

// topicError is one reason a topic is refused; each matches ErrInvalidTopic.
type topicError struct{ reason string }

func (e *topicError) Error() string        { return "outbox: invalid topic: " + e.reason }
func (e *topicError) Is(target error) bool { return target == ErrInvalidTopic }
