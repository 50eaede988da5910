// Package mqtt is the outbox's MQTT machinery, beneath the outbox package's
// public face (its mqtt.go): the publish connection in MQTT 5 and 3.1.1 (its
// frames, the link under it, the CONNECT), the subscriber's sessions over
// paho.golang and paho.mqtt.golang, the one dialer and the broker list with
// the one rule of falling back from 5 to 3.1.1 that both use, reason codes
// and failed connections in words, and TLS files.
//
// It imports no outbox package. It reports what happened as facts (a
// PUBACK's reason code, a packet over the broker's limit, a stall, no
// connection, a lost one); whose fault each is, for the relay, the outbox
// package decides (Options.Classify).
package mqtt
