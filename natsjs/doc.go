// Package natsjs is the NATS JetStream transport: a Publisher that the
// relay drains the outbox through into whatever stream captures each
// topic's subject, every event with its id as Nats-Msg-Id, so that the
// stream stores it once however often the relay sends it within the
// stream's duplicate window. It lives apart from package outbox so that a
// program that speaks MQTT only does not link nats.go.
package natsjs
