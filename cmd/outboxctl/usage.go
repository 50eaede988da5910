package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// usageError marks a wrong command line (exit status 2).
type usageError struct{ error }

// noArgs refuses positional arguments with a usage error.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", args[0])}
	}
	return nil
}
