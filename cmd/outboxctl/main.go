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
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox"
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

// usageError marks a wrong command line (exit status 2).
type usageError struct{ error }

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
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown ") || strings.Contains(err.Error(), "flag") && strings.Contains(err.Error(), "needs an argument") {
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
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(a.demoCmd(), a.relayCmd(), a.initCmd(), a.statusCmd(), a.listCmd(), a.requeueCmd(), a.purgeCmd())
	root.AddCommand(a.benchCmd(), a.fleetCmd())
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

// dbFlags are the flags of every command that opens a database.
type dbFlags struct {
	path    string
	timeout time.Duration
	// Stored limits to set (init only): 0 keeps, negative removes.
	maxMessages, maxBytes int64
}

func (f *dbFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.path, "db", "", "path of the SQLite database (required)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 5*time.Second, "how long to wait for a database locked by another process")
}

// openMode says what a command may do to the database it opens.
type openMode int

const (
	// inspect reads only: nothing is created, migrated or written, not
	// even the disk reserve (status, list).
	inspect openMode = iota
	// existing writes to an outbox that must exist, migrating it if it is
	// older (requeue, purge).
	existing
	// create creates the file and schema when missing (init, relay).
	create
)

// open opens the outbox at --db as mode allows.
func (f *dbFlags) open(ctx context.Context, a *app, mode openMode) (*outbox.Outbox, error) {
	if f.path == "" {
		return nil, usageError{errors.New("--db is required")}
	}
	opts := outbox.Options{
		BusyTimeout: f.timeout,
		MustExist:   mode != create,
		ReadOnly:    mode == inspect,
		Logger:      a.logger,

		MaxPendingMessages: f.maxMessages,
		MaxPendingBytes:    f.maxBytes,
	}
	ob, err := outbox.Open(ctx, f.path, opts)
	if err != nil {
		return nil, f.explain(err)
	}
	return ob, nil
}

// explain turns an error about the database into one line an operator can
// act on.
func (f *dbFlags) explain(err error) error {
	msg := err.Error()
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%s: no such file", f.path)
	case errors.Is(err, outbox.ErrNoSchema):
		return fmt.Errorf("%s has no outbox (create one with: outboxctl init --db %s)", f.path, f.path)
	case strings.Contains(msg, "not a SQLite database"), strings.Contains(msg, "file is not a database"):
		return fmt.Errorf("%s is not a SQLite database", f.path)
	case strings.Contains(msg, "malformed"), strings.Contains(msg, "SQLITE_CORRUPT"):
		return fmt.Errorf("%s is corrupt (SQLite: database disk image is malformed); move it aside and restore a backup", f.path)
	case strings.Contains(msg, "database is locked"), strings.Contains(msg, "SQLITE_BUSY"):
		return fmt.Errorf("%s is locked by another process (waited %s; raise --timeout to wait longer)", f.path, f.timeout)
	case strings.Contains(msg, "readonly"), strings.Contains(msg, "read-only"), errors.Is(err, syscall.EROFS), errors.Is(err, os.ErrPermission),
		strings.Contains(msg, "unable to open database file"):
		return f.whyNotWritable(msg)
	case errors.Is(err, outbox.ErrSchemaTooNew):
		return fmt.Errorf("%s: %s; use a newer outboxctl", f.path, lastPart(msg))
	case errors.Is(err, outbox.ErrSchemaTooOld):
		return fmt.Errorf("%s: %s; outboxctl init --db %s migrates it (stop the relay that uses it first)", f.path, lastPart(msg), f.path)
	}
	return err
}

// whyNotWritable says why SQLite could not open or write the file: it needs
// to write the file and to create PATH-wal and PATH-shm beside it.
func (f *dbFlags) whyNotWritable(msg string) error {
	file, err := os.OpenFile(f.path, os.O_RDWR, 0)
	if err == nil {
		file.Close()
		probe, err := os.CreateTemp(filepath.Dir(f.path), ".outboxctl-probe-*")
		if err == nil {
			probe.Close()
			os.Remove(probe.Name())
			return fmt.Errorf("%s: %s", f.path, lastPart(msg))
		}
	}
	switch {
	case errors.Is(err, syscall.EROFS):
		return fmt.Errorf("%s is on a read-only file system (SQLite needs to write it and create %s-wal and %s-shm)", f.path, filepath.Base(f.path), filepath.Base(f.path))
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%s: no permission to write it or its directory (SQLite needs to create %s-wal and %s-shm)", f.path, filepath.Base(f.path), filepath.Base(f.path))
	}
	return fmt.Errorf("%s cannot be written: %v", f.path, err)
}

// lastPart drops the "outbox: open PATH:" prefixes of a wrapped error.
func lastPart(msg string) string {
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// noArgs refuses positional arguments with a usage error.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", args[0])}
	}
	return nil
}
