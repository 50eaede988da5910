// Command outboxctl runs and inspects SQLite outboxes: a demo with an
// embedded broker, a sidecar relay for applications in any language, and
// tools to look inside an outbox file.
//
//	outboxctl demo
//	outboxctl relay --db /var/lib/till/till.db --broker ssl://broker:8883
//	outboxctl status --db /var/lib/till/till.db --json
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// exit codes
const (
	exitOK    = 0
	exitError = 1 // the command failed
	exitUsage = 2 // the command line was wrong
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// app holds what the subcommands share.
type app struct {
	stdout, stderr io.Writer
	logLevel       string
	logFormat      string
	logger         *slog.Logger
}

func run(args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "outboxctl: "+oneLine(err))
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitError
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "outboxctl",
		Short: "Run and inspect SQLite transactional outboxes",
		Long: `outboxctl runs and inspects SQLite transactional outboxes.

An application writes its business rows and an outbox row in one SQLite
transaction; a relay publishes the outbox rows to an MQTT broker at QoS 1,
in commit order, whenever the broker is reachable.`,
		Example: `  outboxctl demo
  outboxctl relay --db /var/lib/till/till.db --broker ssl://broker.example.com:8883
  outboxctl status --db /var/lib/till/till.db`,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Runnable, so that cobra hands the root's arguments to its Args
		// check instead of failing on an unknown command by itself.
		Args: unknownCommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(a.stderr, a.logLevel, a.logFormat)
			if err != nil {
				return usageError{err}
			}
			a.logger = logger
			return nil
		},
	}
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.PersistentFlags().StringVar(&a.logFormat, "log-format", "text", "log format: text or json")
	root.AddCommand(a.demoCmd(), a.relayCmd(), a.initCmd(), a.statusCmd(), a.listCmd(), a.requeueCmd(), a.purgeCmd())
	root.AddCommand(a.benchCmd(), a.fleetCmd())
	typeUsageErrors(root)
	return root
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
