// Package outbox is a transactional outbox on SQLite for devices that are
// often offline: the application writes its business rows and an outbox row
// in ONE SQLite transaction, and a [Relay] later publishes the outbox rows, in
// commit order, to an MQTT broker at QoS 1, whenever the broker is reachable.
//
// # The model
//
// A committed event is never lost and a rolled-back one is never published.
// Delivery is at least once: a duplicate can only follow a crash or a lost
// connection, and every event carries a stable unique id (a UUIDv7, see
// [NewID]) for consumers to recognise it. Order is commit order, kept by a
// sequence number, never by a timestamp: device clocks jump.
//
// [Open] opens (or creates) the SQLite file and returns an [Outbox]; [New]
// takes the caller's own *sql.DB instead ([OpenDB] opens one with the
// settings the outbox relies on). The application's own tables live in the
// same database ([Outbox.DB]). [Outbox.Enqueue] writes [Message] values
// inside the caller's *sql.Tx, so that they are published only if it
// commits; [Outbox.Transact] runs a function in a write transaction, runs it
// again while SQLite reports the database busy, commits and wakes the relay.
// With a pending limit set ([Options]), a full outbox or a full disk fails
// the enqueue with [ErrFull] or [ErrDiskFull] and the caller's transaction
// rolls back: nothing committed is ever dropped to make room.
//
// # The table contract
//
// The outbox table is a contract that any language can write to: a program
// that inserts a row with a topic and a payload into the same file, in a
// transaction of its own, has its event relayed like one from Enqueue. Every
// other column has a default written in SQL (the id, a UUIDv7, among them),
// and the schema refuses what can never be delivered — a topic that is
// empty, has an MQTT wildcard, a control character or a leading '$', a
// payload over the stored limit — and holds every writer to the pending
// limits. docs/schema.md lists the columns a writer may set.
//
// The whole schema, as SQL, is schema/outbox.sql in this module: what a new
// database gets. Each step from one version to the next is a file of its own
// under schema/outbox/, frozen once released. [SchemaVersion] is the newest
// version; opening an older database for writing migrates it in one
// transaction, and a newer one is refused with [ErrSchemaTooNew], never
// downgraded.
//
// # The relay
//
// [Outbox.NewRelay] returns a [Relay] that drains the outbox to a
// [Publisher]; [NewMQTTPublisher] is the one for MQTT brokers, over MQTT 5
// where the broker speaks it and 3.1.1 otherwise (MQTTOptions.Protocol).
// [Relay.Run] reads pending rows in sequence order, keeps up to
// RelayOptions.Window of them awaiting their acknowledgement, and records
// progress as a high-water mark, in batches: a crash duplicates at most
// Window + max(Window, 256) messages. It reconnects with a backoff that never
// gives up; [Relay.ReconnectNow] cuts the wait short.
//
// Outages are not failures. A refused connection, a timeout, a lost
// connection, a slow link or a broker that says it is busy
// ([ErrBrokerUnavailable]) never counts against a message; the isolation
// rule (docs/delivery.md) finds a message that a broker refuses by closing
// the connection. A message the broker refuses for itself ([ErrRejected], a
// [Refusal]) is charged, and a [RetryPolicy] (RelayOptions.Retry) decides
// when it goes again and when it is parked as dead — kept, listed
// ([Outbox.List]) and requeueable ([Outbox.Requeue]) — while the queue flows
// on; one that can never be delivered ([ErrUndeliverable]) is dead at once.
// The whole contract between the relay and a transport, and whose fault
// each failure is, is in publisher.go ([Publisher], [Token]).
// A message whose Message.Expiry ran out before its turn is parked as
// expired ([StateExpired]), not published; expiry is measured on a stored
// outbox clock that only monotonic time moves, so a wall-clock jump cannot
// expire a backlog. Under MQTT 5 the broker is given what is left.
//
// A lease lets one relay, goroutine or process, drain a database at a time;
// its expiry never compares wall clocks. An idle relay that watches its WAL
// renews it only when another relay announces that it waits (or when work
// comes), so that an idle relay writes nothing. Sent rows are deleted once
// RelayOptions.Retention has passed. A reserve file beside the database
// (Options.ReserveBytes) keeps the relay able to mark and delete rows on a
// full disk, so that the backlog drains and the space comes back.
//
// [Relay.Stats] and [Outbox.Stats] count the rows; [Relay.Metrics] and
// [Outbox.Gauges] read what an exporter scrapes without a scan: counters,
// histograms of publish-to-PUBACK and commit-to-PUBACK, the backlog from
// the maintained counters. Package outboxprom exports them to Prometheus
// and serves health endpoints and a status page; this package does not link
// Prometheus.
//
// # The consumer side
//
// Package consumer (github.com/edgeoutbox/outbox/consumer) applies the
// events on the other side, each once: an Inbox in the consumer's own
// database and a Subscriber that takes them from an MQTT broker.
// [DecodeEvent] parses the CloudEvents envelope the relay publishes in
// structured mode, and [DecodeEventMQTT] either mode, binary mode
// ([EnvelopeCloudEventsBinary]) too.
//
// # Commands to the device
//
// The other way: a backend's command reaches the device, is stored durably
// before it is acknowledged ([Outbox.StoreCommand], called by a transport's
// receiver), and is applied once by [Commands.Run] ([Outbox.NewCommands]):
// the handler's work, the command's state and its answer, an outbox event
// to the command's response topic, commit in one transaction. A command
// past its expiry is answered "expired" and never applied; the clocks it
// is judged by are in docs/commands.md, and so is the SQL for applications
// in other languages.
//
// # The packages
//
// The root package is the outbox: writing events ([Outbox.Enqueue]) and
// relaying them ([Relay]) to any [Publisher] (publisher.go is the whole
// contract a transport implements), with MQTT's ([NewMQTTPublisher])
// beside it; its machinery is in internal packages. Package outboxtest runs
// the delivery guarantees against any Publisher; package outboxprom exports
// the metrics to Prometheus and serves a status page; cmd/outboxctl is what
// a device runs, cmd/outboxlab what a developer runs (demo, bench, fleet).
// README.md's Layout says where each change goes.
//
// # Errors
//
// The errors to test with errors.Is are sentinels. Enqueue validates every
// message before it writes anything and refuses one with an error matching
// [ErrInvalidTopic] (each reason has its own, such as [ErrTopicWildcard] and
// [ErrTopicOutsidePrefix]), [ErrPayloadTooLarge] or [ErrInvalidMessage].
// [ErrFull] and [ErrDiskFull] mean that the caller's transaction must roll
// back; [ErrClosed], [ErrReadOnly] and [ErrNilTx] that the call could not
// write at all. Opening reports a schema it will not use with
// [ErrSchemaTooNew], [ErrSchemaTooOld] or [ErrNoSchema], a table of the
// outbox's name that is someone else's with [ErrForeignTable], and a
// *sql.DB set up wrongly with [ErrUnsupportedDB]; [ErrNotFound] is a message that is not
// there. [Relay.Run] fails with [ErrLeaseLost] when another relay took over;
// a Publisher wraps [ErrRejected] (a [Refusal]), [ErrUndeliverable],
// [ErrBrokerUnavailable], [ErrNotConnected] or [ErrStalled] in its errors;
// and the consumer's
// Inbox.Apply says that it skipped an event with [ErrDuplicate].
package outbox
