// Command outboxctl is what a till runs: a sidecar relay for applications
// in any language, and the tools to look inside an outbox file and mend it.
// The demo, the benchmarks and the fleet simulator are outboxlab's, so that
// none of them ships to a device.
//
//	outboxctl relay --db /var/lib/till/till.db --broker ssl://broker:8883
//	outboxctl status --db /var/lib/till/till.db --json
package main

import (
	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox/internal/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	cli.Main(&cobra.Command{
		Use:   "outboxctl",
		Short: "Run and inspect SQLite transactional outboxes",
		Long: `outboxctl runs and inspects SQLite transactional outboxes.

An application writes its business rows and an outbox row in one SQLite
transaction; a relay publishes the outbox rows to an MQTT broker at QoS 1,
in commit order, whenever the broker is reachable.`,
		Example: `  outboxctl relay --db /var/lib/till/till.db --broker ssl://broker.example.com:8883
  outboxctl status --db /var/lib/till/till.db
  outboxctl list --db /var/lib/till/till.db --state dead
  outboxctl doctor --db /var/lib/till/till.db --broker tcp://broker:1883
  outboxctl command send --broker tcp://broker:1883 --topic tills/7/commands --data '{"lock":true}'`,
		Version: version,
	}, relayCmd, initCmd, statusCmd, listCmd, requeueCmd, purgeCmd, doctorCmd, commandCmd)
}
