// Command outboxlab is what a developer runs beside the outbox: a demo with
// an embedded broker, the benchmarks, and a fleet of simulated devices
// through a broker outage. A till runs outboxctl, which carries none of
// them.
//
//	outboxlab demo
//	outboxlab bench --full
//	outboxlab fleet --devices 500 --outage 30s
package main

import (
	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox/internal/cli"
)

func main() {
	cli.Main(&cobra.Command{
		Use:   "outboxlab",
		Short: "Try, measure and load-test the SQLite outbox",
		Long: `outboxlab is what a developer runs beside the outbox: a demo that needs
no setup (an embedded MQTT broker, a simulated till, outages), the
benchmarks against this machine's limits, and a fleet of simulated devices
through a broker outage.

A till runs outboxctl (relay, status, list, requeue, purge, init), which
carries none of this.`,
		Example: `  outboxlab demo
  outboxlab bench --full > BENCHMARKS-run.md
  outboxlab fleet --devices 100 --outage 10s`,
	}, demoCmd, benchCmd, fleetCmd)
}
