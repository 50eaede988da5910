package metrics

// ProtocolName is how an operator reads what a relay's connection speaks
// (outbox.ProtocolNamer): an MQTT version as "MQTT 5" or "MQTT 3.1.1",
// another protocol's name as it is; "" stays "".
func ProtocolName(p string) string {
	if p != "" && p[0] >= '0' && p[0] <= '9' {
		return "MQTT " + p
	}
	return p
}
