package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// UsageError marks a wrong command line (exit status 2). Main decides the
// exit status from this type alone, so every check of the command line
// returns one: the commands', and cobra's (see typeUsageErrors).
type UsageError struct{ Err error }

// Error says what is wrong with the command line.
func (e UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the error that made the command line wrong.
func (e UsageError) Unwrap() error { return e.Err }

// Usagef returns a UsageError saying what is wrong with the command line.
func Usagef(format string, args ...any) error {
	return UsageError{fmt.Errorf(format, args...)}
}

// NoArgs refuses positional arguments with a usage error.
func NoArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return Usagef("unexpected argument %q", args[0])
	}
	return nil
}

// typeUsageErrors makes cobra's own checks of the command line under root
// return UsageErrors: flag parsing, unknown commands and help topics, and
// the argument checks of every command, cobra's completion commands
// included. root must have Args: unknownCommand and be runnable.
func typeUsageErrors(root *cobra.Command) {
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		// The root parses the flags of a command it does not know ("stat
		// --db x") and fails on the first, before its Args check could
		// name the command: the words before that flag say it.
		if args := cmd.Flags().Args(); cmd == root && len(args) > 0 {
			return unknownCommand(cmd, args)
		}
		return UsageError{err}
	})
	// cobra's suggestion distance, which SuggestionsFor does not default.
	root.SuggestionsMinimumDistance = 2
	// Created now rather than in Execute, so that their argument checks can
	// be set.
	root.InitDefaultHelpCmd()
	if help, _, err := root.Find([]string{"help"}); err == nil {
		help.Args = helpArgs
	}
	root.InitDefaultCompletionCmd()
	typeArgErrors(root)
}

// unknownCommand is the root command's argument check. Left to cobra, an
// unknown command is a plain error raised before any hook of ours runs; the
// root checks it itself to give it a type.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q", args[0])
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		// One line, as every error: cobra's own suggestion is a paragraph
		// that reads as one run-on line once joined.
		msg += " (did you mean " + strings.Join(s, " or ") + "?)"
	}
	return UsageError{fmt.Errorf("%s; see %s --help", msg, cmd.CommandPath())}
}

// helpArgs is the help command's argument check. cobra's help says "Unknown
// help topic" only when finding the topic fails, which it no longer does
// once the root checks its own arguments.
func helpArgs(cmd *cobra.Command, args []string) error {
	if found, _, err := cmd.Root().Find(args); err == nil && found == cmd.Root() {
		return unknownCommand(found, args)
	}
	return nil
}

// typeArgErrors makes every argument check under cmd return a UsageError:
// cobra's own commands (completion bash, ...) check with cobra.NoArgs, whose
// error is plain.
func typeArgErrors(cmd *cobra.Command) {
	if check := cmd.Args; check != nil {
		cmd.Args = func(cmd *cobra.Command, args []string) error {
			err := check(cmd, args)
			var ue UsageError
			if err != nil && !errors.As(err, &ue) {
				return UsageError{err}
			}
			return err
		}
	}
	for _, c := range cmd.Commands() {
		typeArgErrors(c)
	}
}
