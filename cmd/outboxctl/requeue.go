package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/cli"
)

func requeueCmd(a *cli.App) *cobra.Command {
	var db dbFlags
	var ids []string
	var allDead, allExpired bool
	cmd := &cobra.Command{
		Use:   "requeue --db PATH (--id ID... | --all-dead | --all-expired)",
		Short: "Make dead or expired messages pending again",
		Long: `requeue makes dead or expired messages pending again, with their attempts
reset and without their expiry (a requeued expired message is published
however late); the relay publishes them on its next pass. Every --id must
name a dead or expired message, or nothing is changed. --all-dead leaves
expired messages alone, --all-expired dead ones.`,
		Example: `  outboxctl requeue --db till.db --id 019ad2f4-5c1e-7a3b-9f00-3c5e8d1b2a47
  outboxctl requeue --db till.db --all-dead
  outboxctl requeue --db till.db --all-expired`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			given := 0
			for _, g := range []bool{len(ids) > 0, allDead, allExpired} {
				if g {
					given++
				}
			}
			if given != 1 {
				return cli.Usagef("give one of --id (one or more), --all-dead or --all-expired")
			}
			ob, err := db.open(cmd.Context(), a, existing)
			if err != nil {
				return err
			}
			defer ob.Close()
			var n int64
			switch {
			case allDead:
				n, err = ob.RequeueDead(cmd.Context())
			case allExpired:
				n, err = ob.RequeueExpired(cmd.Context())
			default:
				for _, id := range ids {
					r, err := ob.Get(cmd.Context(), id)
					if err != nil {
						return db.explain(err)
					}
					if r.State != outbox.StateDead && r.State != outbox.StateExpired {
						return fmt.Errorf("message %s is %s, not dead or expired; nothing requeued", id, r.State)
					}
				}
				n, err = ob.Requeue(cmd.Context(), ids...)
			}
			if err != nil {
				return db.explain(err)
			}
			fmt.Fprintf(a.Stdout, "requeued %d message(s)\n", n)
			return nil
		},
	}
	db.register(cmd)
	cmd.Flags().StringSliceVar(&ids, "id", nil, "id of a dead or expired message (repeat or comma-separate)")
	cmd.Flags().BoolVar(&allDead, "all-dead", false, "requeue every dead message")
	cmd.Flags().BoolVar(&allExpired, "all-expired", false, "requeue every expired message, without its expiry")
	return cmd
}
