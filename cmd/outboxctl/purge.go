package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox/internal/cli"
)

func purgeCmd(a *cli.App) *cobra.Command {
	var db dbFlags
	var sentBefore time.Duration
	var dead bool
	cmd := &cobra.Command{
		Use:   "purge --db PATH (--sent-before DURATION | --dead)",
		Short: "Delete sent or dead messages",
		Long: `purge deletes sent messages acknowledged more than DURATION ago (the relay
does this by itself after its retention period), or every dead message
(expired ones too).
Pending messages are never deleted. Deletes run in bounded batches so that
writers are not held up.`,
		Example: `  outboxctl purge --db till.db --sent-before 24h
  outboxctl purge --db till.db --dead`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			given := cmd.Flags().Changed("sent-before")
			if given == dead {
				return cli.Usagef("give either --sent-before DURATION or --dead")
			}
			if given && sentBefore < 0 {
				return cli.Usagef("--sent-before %s: want a duration of zero or more", sentBefore)
			}
			ob, err := db.open(cmd.Context(), a, existing)
			if err != nil {
				return err
			}
			defer ob.Close()
			var n int64
			if dead {
				n, err = ob.PurgeDead(cmd.Context())
			} else {
				n, err = ob.PurgeSent(cmd.Context(), time.Now().Add(-sentBefore))
			}
			if err != nil {
				return db.explain(err)
			}
			fmt.Fprintf(a.Stdout, "deleted %d message(s)\n", n)
			return nil
		},
	}
	db.register(cmd)
	cmd.Flags().DurationVar(&sentBefore, "sent-before", 0, "delete sent messages acknowledged longer ago than this (e.g. 24h)")
	cmd.Flags().BoolVar(&dead, "dead", false, "delete every dead message")
	return cmd
}
