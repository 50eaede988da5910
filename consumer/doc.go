// Package consumer is the consumer side of the outbox: what a backend (or
// another device) runs to take the events a relay published and apply each
// exactly once.
//
// An [Inbox] applies each event once, in the consumer's own database,
// SQLite or PostgreSQL ([DialectPostgres], through pgx's stdlib driver,
// which the library does not import): [Inbox.Apply] runs a [Handler] and
// records the event's source and id in one transaction, and returns
// outbox.ErrDuplicate, without running the handler, for an event it applied
// within InboxOptions.DedupeWindow. The window is measured on an inbox
// clock stored in that database, which wall-clock jumps do not move.
//
// A [Subscriber] receives events from an MQTT broker at QoS 1 in a
// persistent session, over MQTT 5 or 3.1.1, applies each through an Inbox
// and acknowledges it only once its transaction has committed; a message
// that is not a valid event is quarantined and never blocks the ones behind
// it. Events are decoded with outbox.DecodeEventMQTT, in either CloudEvents
// content mode.
//
// The inbox's schema is SQL, one file per migration under schema/ in this
// package's directory, embedded.
package consumer
