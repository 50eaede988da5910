// Package integration holds the tests that run the outbox against real
// brokers and real processes: the conformance suite (outboxtest) and MQTT's
// own cases over mochi, Mosquitto, NATS, RabbitMQ and ejabberd, and the
// crash and power-loss tests. README.md says what runs and how to make a
// long run.
package integration

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
