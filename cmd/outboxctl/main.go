// Command outboxctl runs and inspects SQLite outboxes: a demo with an
// embedded broker, a sidecar relay for applications in any language, and
// tools to look inside an outbox file.
//
//	outboxctl demo
//	outboxctl relay --db /var/lib/till/till.db --broker ssl://broker:8883
//	outboxctl status --db /var/lib/till/till.db --json
package main

import (
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox/internal/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// app holds what the subcommands share.
type app struct{ *cli.App }

func run(args []string, stdout, stderr io.Writer) int {
	a := &app{&cli.App{Stdout: stdout, Stderr: stderr}}
	return a.Run(a.rootCmd(), args)
}

func (a *app) rootCmd() *cobra.Command {
	return a.Root(&cobra.Command{
		Use:   "outboxctl",
		Short: "Run and inspect SQLite transactional outboxes",
		Long: `outboxctl runs and inspects SQLite transactional outboxes.

An application writes its business rows and an outbox row in one SQLite
transaction; a relay publishes the outbox rows to an MQTT broker at QoS 1,
in commit order, whenever the broker is reachable.`,
		Example: `  outboxctl demo
  outboxctl relay --db /var/lib/till/till.db --broker ssl://broker.example.com:8883
  outboxctl status --db /var/lib/till/till.db`,
		Version: version,
	}, a.demoCmd(), a.relayCmd(), a.initCmd(), a.statusCmd(), a.listCmd(), a.requeueCmd(), a.purgeCmd(), a.benchCmd(), a.fleetCmd())
}
