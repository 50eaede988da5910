// Package cli holds what the outbox's commands share: outboxctl, which a
// till runs, and outboxlab, which a developer runs. It gives a command's
// root its logging flags and its exit statuses, and types every error of
// the command line (usage.go), so that both commands fail alike.
package cli

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

// exit statuses
const (
	exitOK    = 0
	exitError = 1 // the command failed
	exitUsage = 2 // the command line was wrong
)

// App holds what a command's subcommands share.
type App struct {
	Stdout, Stderr io.Writer
	// Logger logs as --log-level and --log-format say; it is set before any
	// subcommand runs.
	Logger *slog.Logger

	logLevel, logFormat string
}

// setUpRoot makes root a command's root: it adds the logging flags and subs,
// prints its help when run alone, and types its command-line errors. root
// brings its Use, Short, Long, Example and Version.
func (a *App) setUpRoot(root *cobra.Command, subs ...*cobra.Command) *cobra.Command {
	root.SilenceUsage = true
	root.SilenceErrors = true
	// Runnable, so that cobra hands the root's arguments to its Args check
	// instead of failing on an unknown command by itself.
	root.Args = unknownCommand
	root.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		logger, err := newLogger(a.Stderr, a.logLevel, a.logFormat)
		if err != nil {
			return UsageError{err}
		}
		a.Logger = logger
		return nil
	}
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.PersistentFlags().StringVar(&a.logFormat, "log-format", "text", "log format: text or json")
	root.AddCommand(subs...)
	typeUsageErrors(root)
	return root
}

// Main runs root, with the subcommands that subs make, on the process's
// arguments, and exits with its status.
func Main(root *cobra.Command, subs ...func(*App) *cobra.Command) {
	a := &App{Stdout: os.Stdout, Stderr: os.Stderr}
	cmds := make([]*cobra.Command, len(subs))
	for i, sub := range subs {
		cmds[i] = sub(a)
	}
	os.Exit(a.run(a.setUpRoot(root, cmds...), os.Args[1:]))
}

// run runs root with args until it returns or SIGINT or SIGTERM cancels its
// context, and returns the exit status. An error is one line on Stderr,
// after the command's name.
func (a *App) run(root *cobra.Command, args []string) int {
	root.SetArgs(args)
	root.SetOut(a.Stdout)
	root.SetErr(a.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(a.Stderr, root.Name()+": "+oneLine(err))
	var ue UsageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitError
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
